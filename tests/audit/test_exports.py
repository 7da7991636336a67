"""Exports read back by independent tools: securesystemslib (DSSE), in-toto-attestation (Statement v1),
prov and rdflib (PROV-JSON, PROV-N, PROV-O). The vectors in tests/vectors/export are reproduced byte
for byte."""

from __future__ import annotations

import ast
import base64
import copy
import hashlib
import json
from pathlib import Path as FilePath
from typing import Any

import pytest
import rdflib
from google.protobuf import json_format
from hypothesis import given
from hypothesis import strategies as st
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement
from prov.model import (
    ProvActivity,
    ProvAgent,
    ProvAttribution,
    ProvCommunication,
    ProvDelegation,
    ProvDerivation,
    ProvDocument,
    ProvEntity,
    ProvGeneration,
)
from securesystemslib.dsse import Envelope as DsseEnvelope
from securesystemslib.exceptions import VerificationError
from securesystemslib.signer import SSlibKey

from countersign.canonical import sha256_digest
from countersign.export import FORMATS, ExportError, export_path, prov_bytes, prov_document, statement
from countersign.export.dsse import dsse_envelopes
from countersign.export.intoto import PREDICATE_TYPE
from countersign.records import PAYLOAD_TYPE_EDGE, PAYLOAD_TYPE_NODE, Construction, Path
from countersign.registry import Registry
from tests.audit.material import HOSTILE, OUTPUT, mesh, receipts, sample_path, with_instance
from tests.core.strategies import MESH, valid_paths

pytestmark = pytest.mark.offline

VECTORS = FilePath(__file__).parents[1] / "vectors"
EXPORT_DIR = VECTORS / "export"
PROV_READ = {"prov-json": ("json", {}), "prov-n": ("provn", {}), "prov-o": ("rdf", {"rdf_format": "turtle"})}


def vector_path() -> tuple[Path, bytes]:
    vector = json.loads((VECTORS / "valid" / "signed-dag.json").read_text())
    return Path.from_json(vector["presentation"]["path"]), base64.b64decode(vector["presentation"]["output_base64"])


def sslib_keys(registry: Registry) -> dict[str, SSlibKey]:
    return {
        key_id: SSlibKey(key_id, "ed25519", "ed25519", {"public": entry.public_key.raw.hex()})
        for keys in registry.deployers.values()
        for key_id, entry in keys.items()
    }


def read_envelope(envelope: dict[str, Any]) -> DsseEnvelope:
    return DsseEnvelope.from_dict(copy.deepcopy(envelope))  # from_dict rewrites the signatures it is given


# --- DSSE --------------------------------------------------------------------------------------


def test_every_record_and_cosigned_edge_is_a_dsse_envelope_securesystemslib_verifies() -> None:
    m = mesh()
    path = sample_path(m, depth=4)
    keys = sslib_keys(m.registry)
    envelopes = dsse_envelopes(path)
    cosigned = sum(1 for e in path.envelopes if e.record.cosigs)
    assert cosigned == 3
    assert len(envelopes) == len(path) + cosigned
    records = [e for e in envelopes if e["payloadType"] == PAYLOAD_TYPE_NODE]
    edges = [e for e in envelopes if e["payloadType"] == PAYLOAD_TYPE_EDGE]
    for exported, original in zip(records, path.envelopes, strict=True):
        envelope = read_envelope(exported)
        assert envelope.payload == original.record_bytes()
        accepted = envelope.verify([keys[original.key_id]], 1)
        assert list(accepted) == [original.key_id]
    for exported, child in zip(edges, [e for e in path.envelopes if e.record.cosigs], strict=True):
        envelope = read_envelope(exported)
        signers = [keys[c.key_id] for c in child.record.cosigs]
        assert set(envelope.verify(signers, 2)) == {c.key_id for c in child.record.cosigs}
        manifest = json.loads(envelope.payload)
        assert manifest["domain"] == "countersign/edge-manifest/v1"
        assert manifest["child"]["nonce"] == child.record.nonce


@pytest.mark.parametrize("tamper", ["payload", "payload-type", "signature", "other-key"])
def test_a_tampered_dsse_envelope_is_refused(tamper: str) -> None:
    m = mesh()
    path = sample_path(m, depth=2)
    keys = sslib_keys(m.registry)
    exported = copy.deepcopy(dsse_envelopes(path)[0])
    key = keys[path.envelopes[0].key_id]
    if tamper == "payload":
        payload = base64.b64decode(exported["payload"]).replace(b'"depth":0', b'"depth":1')
        exported["payload"] = base64.b64encode(payload).decode()
    elif tamper == "payload-type":
        exported["payloadType"] = PAYLOAD_TYPE_EDGE  # domain separation: a node signature is no edge signature
    elif tamper == "signature":
        sig = bytearray(base64.b64decode(exported["signatures"][0]["sig"]))
        sig[5] ^= 1
        exported["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()
    else:
        other = keys[path.envelopes[1].key_id]
        exported["signatures"][0]["keyid"] = other.keyid
        key = other
    with pytest.raises(VerificationError):
        read_envelope(exported).verify([key], 1)


def test_naive_sig_exports_its_signed_view_and_unsigned_baselines_are_refused() -> None:
    m = mesh()
    naive = sample_path(m, Construction.NAIVE_SIG, depth=2)
    keys = sslib_keys(m.registry)
    envelope = read_envelope(dsse_envelopes(naive)[1])
    assert envelope.verify([keys[naive.envelopes[1].key_id]], 1)
    view = json.loads(envelope.payload)
    assert "parent" not in view
    assert "depth" not in view  # what NAIVE-SIG signs, and nothing more
    for construction in (Construction.NO_CHAIN, Construction.HASH_ONLY):
        with pytest.raises(ExportError, match="no signature"):
            export_path(sample_path(m, construction, depth=2), "dsse")


@given(
    valid_paths(constructions=st.sampled_from([Construction.LINKED_LIST, Construction.MERKLE, Construction.SIGNED_DAG]))
)
def test_dsse_envelopes_of_any_signed_path_verify(case: tuple[Path, bytes]) -> None:
    path, _ = case
    keys = sslib_keys(MESH.registry)
    for exported in dsse_envelopes(path):
        envelope = read_envelope(exported)
        signers = [keys[s.keyid] for s in envelope.signatures.values()]
        assert len(envelope.verify(signers, len(signers))) == len(signers)


# --- in-toto ------------------------------------------------------------------------------------


def read_statement(data: bytes) -> Statement:
    proto = json_format.Parse(data.decode(), statement_pb2.Statement())
    parsed = Statement.copy_from_pb(proto)
    parsed.validate()
    return parsed


def test_in_toto_statement_names_the_output_and_carries_the_path() -> None:
    m = mesh()
    path = sample_path(m)
    data = export_path(path, "in-toto", output=OUTPUT, subject_name="answer.txt")
    parsed = read_statement(data)
    assert parsed.pb.type == "https://in-toto.io/Statement/v1"
    assert parsed.pb.predicate_type == PREDICATE_TYPE
    (subject,) = parsed.pb.subject
    assert subject.name == "answer.txt"
    assert dict(subject.digest) == {"sha256": hashlib.sha256(OUTPUT).hexdigest()}
    predicate = json_format.MessageToDict(parsed.pb.predicate)
    assert predicate["emitter"]["deployer"] == path.leaf.record.deployer
    # The path inside verifies as it was: re-parse it from the plain JSON (protobuf's Struct holds doubles).
    inner = Path.from_json(json.loads(data)["predicate"]["path"])
    assert inner.to_bytes() == path.to_bytes()


def test_in_toto_refuses_other_output_bytes_and_a_leaf_without_output() -> None:
    m = mesh()
    path = sample_path(m)
    with pytest.raises(ExportError, match="differs"):
        statement(path, OUTPUT + b"!")
    without_output = Path(path.envelopes[:-1])
    assert without_output.leaf.record.output is None
    with pytest.raises(ExportError, match="no output section"):
        statement(without_output)


# --- W3C PROV -------------------------------------------------------------------------------------


def _records(doc: ProvDocument, kind: type) -> list[Any]:
    return list(doc.get_records(kind))


def _attr(record: Any, name: str) -> str:
    return str(next(v for k, v in record.attributes if k.localpart == name))


def test_prov_has_agents_delegations_derivations_and_the_output() -> None:
    m = mesh()
    path = sample_path(m, depth=4)
    doc = prov_document(path)
    agents = _records(doc, ProvAgent)
    assert len(agents) == 3 + 4  # three deployers (organisations), four agent instances
    delegations = _records(doc, ProvDelegation)
    hosting = [d for d in delegations if d.identifier.localpart.startswith("hosting-")]
    edges = [d for d in delegations if d.identifier.localpart.startswith("delegation-")]
    assert len(hosting) == 4
    assert len(edges) == len(path) - 1
    for edge, (parent, child) in zip(edges, zip(path.envelopes, path.envelopes[1:], strict=False), strict=True):
        assert _attr(edge, "delegate").endswith(child.record.agent.instance)
        assert _attr(edge, "responsible").endswith(parent.record.agent.instance)
        extra = {k.localpart: str(v) for k, v in edge.extra_attributes}
        assert extra["edge"] == "cross-deployer-cosigned"
        assert extra["parentCosigner"] == parent.record.deployer
        assert extra["childCosignerKeyId"] == child.record.key_id
    assert len(_records(doc, ProvDerivation)) == len(path) - 1
    assert len(_records(doc, ProvActivity)) == len(path)
    outputs = [e for e in _records(doc, ProvEntity) if e.identifier.namespace.prefix == "output"]
    assert [_attr(o, "sha256") for o in outputs] == [sha256_digest(OUTPUT)]
    generations = _records(doc, ProvGeneration)
    assert len(generations) == 1
    attributed = [a for a in _records(doc, ProvAttribution) if _attr(a, "entity").startswith("output:")]
    assert {_attr(a, "agent").split(":")[0] for a in attributed} == {"instance", "deployer"}


@pytest.mark.parametrize("fmt", sorted(PROV_READ))
def test_prov_round_trips_through_prov(fmt: str) -> None:
    m = mesh()
    path = with_instance(m, sample_path(m), 2, HOSTILE)
    data = prov_bytes(path, fmt)
    kind, options = PROV_READ[fmt]
    assert ProvDocument.deserialize(content=data.decode(), format=kind, **options) == prov_document(path)


def test_prov_o_is_turtle_rdflib_reads_on_its_own() -> None:
    m = mesh()
    path = sample_path(m, depth=3)
    graph = rdflib.Graph().parse(data=prov_bytes(path, "prov-o").decode(), format="turtle")
    prov = rdflib.Namespace("http://www.w3.org/ns/prov#")
    derived = list(graph.subject_objects(prov.wasDerivedFrom))
    assert len(derived) == 2
    assert len(list(graph.subjects(rdflib.RDF.type, prov.Organization))) == 3
    delegations = list(graph.subjects(rdflib.RDF.type, prov.Delegation))
    assert len(delegations) == 3 + 2  # hosting of each instance, and the two delegation edges


@given(valid_paths())
def test_prov_json_and_prov_n_round_trip_for_any_path(case: tuple[Path, bytes]) -> None:
    path, _ = case
    doc = prov_document(path)
    for fmt in ("prov-json", "prov-n"):
        kind, options = PROV_READ[fmt]
        assert ProvDocument.deserialize(content=prov_bytes(path, fmt).decode(), format=kind, **options) == doc


# --- vectors, determinism, the optional extra, purity ---------------------------------------------


EXPORT_FILES = {
    "dsse": "signed-dag.dsse.jsonl",
    "in-toto": "signed-dag.intoto.json",
    "prov-json": "signed-dag.prov.json",
    "prov-n": "signed-dag.provn",
    "prov-o": "signed-dag.prov.ttl",
}


def test_export_vectors_cover_every_format() -> None:
    assert set(EXPORT_FILES) == set(FORMATS)
    assert {p.name for p in EXPORT_DIR.iterdir()} == set(EXPORT_FILES.values())


@pytest.mark.parametrize("fmt", sorted(EXPORT_FILES))
def test_exporter_reproduces_the_vector_byte_for_byte(fmt: str) -> None:
    path, output = vector_path()
    exported = export_path(path, fmt, output=output, subject_name="output.bin")
    assert exported == (EXPORT_DIR / EXPORT_FILES[fmt]).read_bytes()


FORBIDDEN_IMPORTS = {
    "os", "io", "socket", "sqlite3", "subprocess", "pathlib", "shutil", "tempfile", "urllib", "http",
    "grpc", "signer", "verifier", "coordinator", "logging", "time", "asyncio", "countersign_cli",
}  # fmt: skip


@pytest.mark.parametrize(
    "module", sorted((FilePath(__file__).parents[2] / "countersign" / "export").glob("*.py")), ids=lambda p: p.name
)
def test_export_package_is_pure_core(module: FilePath) -> None:
    for node in ast.walk(ast.parse(module.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            assert name.split(".")[0] not in FORBIDDEN_IMPORTS, f"{module.name} imports {name}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            assert node.func.id not in {"open", "print", "input", "exec", "eval"}, f"{module.name} calls {node.func.id}"


# --- PROV-O as an RDF tool queries it (issue 29) ---------------------------------------------------

PROV_PREFIX = "PREFIX prov: <http://www.w3.org/ns/prov#>\n"


def _receipt_path() -> Path:
    """A path whose last edge is the agent's own output receipt: the same agent, not a delegation."""
    m = mesh()
    return receipts(m, sample_path(m, depth=3), [b"the writer's turn\n"])[0]


def _instance(record: Any) -> str:
    return f"urn:countersign:prov:instance:{record.deployer}/{record.agent.instance}"


def test_prov_o_answers_acted_on_behalf_of_for_each_delegation_and_never_for_itself() -> None:
    path = _receipt_path()
    records = [e.record for e in path.envelopes]
    assert (records[3].deployer, records[3].agent) == (records[2].deployer, records[2].agent)  # the receipt
    graph = rdflib.Graph().parse(data=prov_bytes(path, "prov-o").decode(), format="turtle")
    between_agents = graph.query(PROV_PREFIX + """
        SELECT ?child ?parent WHERE {
            ?child prov:actedOnBehalfOf ?parent . ?child a prov:SoftwareAgent . ?parent a prov:SoftwareAgent .
        }""")  # fmt: skip
    expected = {(_instance(records[i]), _instance(records[i - 1])) for i in (1, 2)}
    assert {(str(c), str(p)) for c, p in between_agents} == expected  # one per delegation: not the receipt edge
    assert not list(graph.query(PROV_PREFIX + "SELECT ?a WHERE { ?a prov:actedOnBehalfOf ?a }"))
    hosting = graph.query(PROV_PREFIX + """
        SELECT ?instance ?deployer WHERE { ?instance prov:actedOnBehalfOf ?deployer . ?deployer a prov:Organization }
    """)  # fmt: skip
    assert {(str(i), str(d).rsplit(":", 1)[1]) for i, d in hosting} == {(_instance(r), r.deployer) for r in records}
    # The unqualified statements say what the qualified ones do (PROV-O asserts both).
    qualified = graph.query(
        PROV_PREFIX
        + """
        SELECT ?child ?parent WHERE { ?child prov:qualifiedDelegation ?d . ?d prov:agent ?parent }"""
    )
    binary = graph.query(PROV_PREFIX + "SELECT ?child ?parent WHERE { ?child prov:actedOnBehalfOf ?parent }")
    assert set(qualified) == set(binary)
    associated = graph.query(PROV_PREFIX + "SELECT ?run ?agent WHERE { ?run prov:wasAssociatedWith ?agent }")
    assert sorted(str(a) for _, a in associated) == sorted(_instance(r) for r in records)
    informed = graph.query(PROV_PREFIX + """
        SELECT ?later ?earlier WHERE { ?later prov:wasInformedBy ?earlier . ?q prov:activity ?earlier .
                                       ?later prov:qualifiedCommunication ?q }""")  # fmt: skip
    runs = [f"urn:countersign:prov:run:sha256-{e.digest()[7:]}" for e in path.envelopes]
    assert {(str(later), str(earlier)) for later, earlier in informed} == {(runs[3], runs[2])}


def test_prov_has_no_delegation_from_an_agent_to_itself() -> None:
    path = _receipt_path()
    doc = prov_document(path)
    delegations = [d for d in _records(doc, ProvDelegation) if d.identifier.localpart.startswith("delegation-")]
    assert len(delegations) == 2
    assert all(_attr(d, "delegate") != _attr(d, "responsible") for d in delegations)
    (continuation,) = _records(doc, ProvCommunication)
    assert {k.localpart: str(v) for k, v in continuation.extra_attributes} == {"edge": "same-agent"}
    for fmt, (kind, options) in PROV_READ.items():
        assert ProvDocument.deserialize(content=prov_bytes(path, fmt).decode(), format=kind, **options) == doc
