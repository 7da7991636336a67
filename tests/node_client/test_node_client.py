"""A foreign client, built from proto/ alone: a Node program (@grpc/grpc-js, @grpc/proto-loader and
protobufjs from npm, at the versions of package-lock.json, installed by ``make node-deps``) loads
``proto/countersign/v1/verifier.proto`` and the two google.rpc protos proto/ ships for the typed
errors, calls ``VerifyPath`` and ``VerifySession`` over mTLS on a real mesh, and decodes each refusal's
``google.rpc.ErrorInfo``: an accept, the replay, a substituted output, and a typed refusal of each."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from google.rpc import error_details_pb2, status_pb2

from countersign.client import Runtime
from countersign.client.tls import verifier_dns
from countersign.sessions import SessionEvidence
from countersign_cli.localmesh import LocalMesh

HERE = Path(__file__).parent
REPO = HERE.parents[1]
PROTO = REPO / "proto"


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.mark.offline
def test_proto_ships_the_google_rpc_protos_the_sdk_decodes_with() -> None:
    """The copies under proto/google/rpc declare the messages the servers send, field for field (the
    Python SDK decodes with googleapis-common-protos, pinned in constraints.txt)."""
    for name, module in (("status.proto", status_pb2), ("error_details.proto", error_details_pb2)):
        text = (PROTO / "google" / "rpc" / name).read_text()
        assert "package google.rpc;" in text
        for message in module.DESCRIPTOR.message_types_by_name.values():
            body = text.split(f"message {message.name} {{", 1)[1]
            for field in message.fields:
                assert f" {field.name} = {field.number};" in body, (name, message.name, field.name)


@pytest.mark.daemons
def test_a_node_client_from_proto_alone_verifies_and_reads_typed_refusals(
    runtime: Callable[[str], Runtime], runtime_mesh: LocalMesh, tmp_path: Path
) -> None:
    node = shutil.which("node")
    assert node, "node is not installed: make node-deps"
    assert (HERE / "node_modules" / "@grpc" / "grpc-js").is_dir(), "the npm packages are not installed: make node-deps"
    producer = runtime("deployer-a")
    agent = producer.root("node-writer", "foreign")
    output = b"checked by a client in another language\n"
    receipt = producer.receipt(agent, output)
    turns = [b"turn one\n", b"turn two\n"]
    receipts = [producer.receipt(agent, turn, session="node-session") for turn in turns]
    receipts.append(producer.close_session(agent, session="node-session").path)
    session = SessionEvidence(agent, tuple(path.leaf for path in receipts))
    tls = runtime_mesh.tls_for("client")
    job = {
        "proto": str(PROTO), "address": runtime_mesh.daemons["verifier-0"].address, "server_name": verifier_dns(),
        "ca": tls.ca, "cert": tls.cert, "key": tls.key, "path": b64(receipt.to_bytes()), "output": b64(output),
        "session": b64(session.to_bytes()), "outputs": [*map(b64, turns), None],
    }  # fmt: skip
    (tmp_path / "job.json").write_text(json.dumps(job))
    done = subprocess.run(
        [node, str(HERE / "client.js"), str(tmp_path / "job.json")], cwd=HERE, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    answers = json.loads(done.stdout)

    accepted = answers["path_accept"]
    assert accepted["verdict"]["verdict"] == "ACCEPT", accepted
    assert (accepted["emitter"]["deployer"], accepted["emitter"]["agent_instance"]) == ("deployer-a", "node-writer")
    assert int(accepted["registry_sequence"]) >= 3
    assert answers["path_replay"]["verdict"]["verdict"] == "REJECT"
    assert answers["path_replay"]["verdict"]["reason"] == "NONCE_REPLAYED"
    assert answers["path_substituted"]["verdict"]["reason"] == "OUTPUT_MISMATCH"
    refused = answers["path_refused"]["error"]
    assert refused["status"] == "INVALID_ARGUMENT"
    assert refused["error_info"] == [
        {"reason": "INVALID_ARGUMENT", "domain": "countersign.dev", "metadata": {"retryable": "false"}}
    ]

    session_accepted = answers["session_accept"]
    assert session_accepted["verdict"]["verdict"] == "ACCEPT", session_accepted
    assert session_accepted["session"] == {"session": "node-session", "receipts": 3, "closed": True}
    assert int(session_accepted["emitter"]["seq"]) == 2  # a uint64: a string in JSON (longs: String)
    assert answers["session_replay"]["verdict"]["reason"] == "NONCE_REPLAYED"
    session_refused = answers["session_refused"]["error"]
    assert session_refused["status"] == "INVALID_ARGUMENT" and "no-such-policy" in session_refused["message"]
    assert [info["reason"] for info in session_refused["error_info"]] == ["INVALID_ARGUMENT"]
