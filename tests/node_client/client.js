// A foreign client of the verifier, built from proto/ alone: countersign/v1/*.proto and the two
// google.rpc protos proto/ ships for the typed errors (google/rpc/status.proto, error_details.proto;
// docs/api.md "Errors"). Run by tests/node_client/test_node_client.py:
//
//   node client.js JOB.json   ->   one JSON object on stdout, what each call answered
//
// JOB: {"proto": dir, "address": host:port, "server_name": ..., "ca"/"cert"/"key": PEM files,
//       "path": base64 path JSON, "output": base64 bytes,
//       "session": base64 session evidence JSON, "outputs": [base64 bytes or null (not presented), ...]}
'use strict';

const crypto = require('node:crypto');
const fs = require('node:fs');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const protobuf = require('protobufjs');

const job = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const loaded = protoLoader.loadSync(['countersign/v1/verifier.proto'], {
  includeDirs: [job.proto], keepCase: true, longs: String, enums: String, defaults: true, oneofs: true,
});
const Verifier = grpc.loadPackageDefinition(loaded).countersign.v1.Verifier;

// The typed error: grpc-status-details-bin holds a google.rpc.Status whose details carry an ErrorInfo.
const rpc = new protobuf.Root();
rpc.resolvePath = (origin, target) => path.join(job.proto, target);
rpc.loadSync(['google/rpc/status.proto', 'google/rpc/error_details.proto']);
const Status = rpc.lookupType('google.rpc.Status');
const ErrorInfo = rpc.lookupType('google.rpc.ErrorInfo');

function typedError(error) {
  const [details] = error.metadata ? error.metadata.get('grpc-status-details-bin') : [];
  const infos = [];
  if (details) {
    for (const any of Status.decode(details).details) {
      if (any.type_url === 'type.googleapis.com/google.rpc.ErrorInfo') {
        const info = ErrorInfo.toObject(ErrorInfo.decode(any.value));
        infos.push({reason: info.reason, domain: info.domain, metadata: info.metadata || {}});
      }
    }
  }
  return {status: grpc.status[error.code], message: error.details, error_info: infos};
}

const credentials = grpc.credentials.createSsl(
  fs.readFileSync(job.ca), fs.readFileSync(job.key), fs.readFileSync(job.cert));
const client = new Verifier(job.address, credentials, {
  'grpc.ssl_target_name_override': job.server_name, 'grpc.default_authority': job.server_name,
});

function call(method, request) {
  return new Promise((resolve) => {
    const deadline = new Date(Date.now() + 20000);
    client[method](request, {deadline}, (error, response) => {
      if (error) {
        resolve({error: typedError(error)});
      } else {
        resolve({verdict: response.verdict, registry_sequence: response.registry_sequence,
                 emitter: response.attribution ? response.attribution.emitter : null,
                 session: response.session || null});
      }
    });
  });
}

const sha256 = (bytes) => crypto.createHash('sha256').update(bytes).digest();

async function main() {
  const pathJson = Buffer.from(job.path, 'base64');
  const output = Buffer.from(job.output, 'base64');
  const session = Buffer.from(job.session, 'base64');
  const outputs = job.outputs.map((each) => (each === null ? {absent: true} : {sha256: sha256(Buffer.from(each, 'base64'))}));
  const answers = {};
  answers.path_accept = await call('VerifyPath', {path: pathJson, output_sha256: sha256(output), mode: 'ACCEPT'});
  answers.path_replay = await call('VerifyPath', {path: pathJson, output_sha256: sha256(output), mode: 'ACCEPT'});
  answers.path_substituted = await call('VerifyPath', {path: pathJson, output: Buffer.from('not what was said'),
                                                        mode: 'AUDIT'});
  // Both the bytes and their digest: a malformed request, refused with a typed error.
  answers.path_refused = await call('VerifyPath', {path: pathJson, output, output_sha256: sha256(output),
                                                    mode: 'AUDIT'});
  answers.session_accept = await call('VerifySession', {session, outputs, mode: 'ACCEPT', require_closed: true});
  answers.session_replay = await call('VerifySession', {session, outputs, mode: 'ACCEPT'});
  // A consumer policy the verifier does not know: refused with a typed error, nothing checked.
  answers.session_refused = await call('VerifySession', {session, outputs, mode: 'AUDIT', policy: 'no-such-policy'});
  client.close();
  process.stdout.write(JSON.stringify(answers) + '\n');
}

main().catch((error) => {
  process.stderr.write(String(error && error.stack || error) + '\n');
  process.exit(1);
});
