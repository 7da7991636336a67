"""The committed vectors are what the generator produces, and the verifier agrees with every one."""

from __future__ import annotations

import base64
import filecmp
import json
import subprocess
import sys
from pathlib import Path as FilePath
from typing import Any

import pytest
import rfc8785

from countersign.canonical import b64url_decode, pae, sha256_digest
from countersign.keys import PublicKey
from countersign.policy import PolicyError, parse_policy, policy_from_json
from countersign.reasons import Reason
from countersign.records import PAYLOAD_TYPE_EDGE, PAYLOAD_TYPE_NODE, MalformedError, Path, parse_json
from countersign.registry import Registry
from countersign.state import InMemoryState
from countersign.verify import Mode, VerifierPolicy, malformed_result, verify_path

VECTORS = FilePath(__file__).parents[1] / "vectors"
CASES = [case for kind in ("valid", "invalid", "policy") for case in sorted((VECTORS / kind).glob("*.json"))]


@pytest.mark.daemons  # runs the generator in a child process
def test_generator_output_matches_committed_vectors(tmp_path: FilePath) -> None:
    subprocess.run([sys.executable, str(VECTORS / "generate.py"), "--out", str(tmp_path)], check=True)
    committed = {p.relative_to(VECTORS) for p in VECTORS.rglob("*.json")}
    generated = {p.relative_to(tmp_path) for p in tmp_path.rglob("*.json")}
    assert generated == committed
    for relative in sorted(committed):
        assert filecmp.cmp(VECTORS / relative, tmp_path / relative, shallow=False), f"{relative} differs"


def _path_bytes(presentation: dict[str, Any]) -> bytes:
    if "path" in presentation:
        return json.dumps(presentation["path"]).encode()
    if "path_text" in presentation:
        return str(presentation["path_text"]).encode()
    return base64.b64decode(presentation["path_base64"])


def _verify(vector: dict[str, Any], presentation: dict[str, Any], state: InMemoryState) -> dict[str, Any]:
    registry = Registry.from_json(vector["registry"])
    skew = vector["clock_skew_ms"]
    consumer_policy = policy_from_json(vector["consumer_policy"]) if "consumer_policy" in vector else None
    policy = (
        VerifierPolicy.unsafe_allow_baselines(skew) if vector["allow_baselines"] else VerifierPolicy(clock_skew_ms=skew)
    )
    try:
        path = Path.from_bytes(_path_bytes(presentation))
    except MalformedError as exc:
        result = malformed_result(exc)
    else:
        result = verify_path(
            path,
            base64.b64decode(presentation["output_base64"]),
            registry=registry,
            state=state,
            mode=Mode(vector["mode"]),
            now_ms=vector["now_ms"],
            policy=policy,
            consumer_policy=consumer_policy,
        )
    found = {"verdict": result.verdict.value, "reason": result.reason and result.reason.value, "index": result.index}
    if consumer_policy is not None:  # policy vectors also pin the clause and the attribution (spec 12.1)
        verdict = result.to_json()
        violated = result.reason is Reason.CONSUMER_POLICY_VIOLATION
        found["clause"] = result.detail.split(": ", 1)[0] if violated else None
        found |= {key: verdict[key] for key in ("emitter", "edges", "registry_sequence")}
    return found


@pytest.mark.offline
@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_vector_verdict(case: FilePath) -> None:
    vector = json.loads(case.read_text())
    state = InMemoryState()
    for before in vector["before"]:
        assert _verify(vector, before, state)["verdict"] == "ACCEPT", "setup presentation must be accepted"
    assert _verify(vector, vector["presentation"], state) == vector["expected"]


@pytest.mark.offline
def test_every_reason_code_has_a_vector() -> None:
    # Session reasons have session vectors (tests/vectors/sessions/, tests/core/test_session_vectors.py).
    sessions = sorted((VECTORS / "sessions").rglob("*.json"))
    covered = {json.loads(c.read_text())["expected"]["reason"] for c in [*CASES, *sessions]}
    # REGISTRY_STALE is decided by the verifier service from its registry's age, not by a path.
    assert {r.value for r in Reason} - covered == {"REGISTRY_STALE"}


@pytest.mark.offline
def test_policy_vectors_name_each_clause_they_violate() -> None:
    policy_cases = [json.loads(c.read_text()) for c in CASES if c.parent.name == "policy"]
    assert {v["expected"]["clause"] for v in policy_cases} >= {
        "allowed_deployers", "cross_deployer_construction", "max_depth", "max_evidence_age_ms",
        "require_closed_session", "all_of", "any_of",
    }  # fmt: skip
    accepted = [v for v in policy_cases if v["expected"]["verdict"] == "ACCEPT"]
    assert accepted and all(v["expected"]["emitter"] is not None for v in accepted)


@pytest.mark.offline
def test_policy_document_vectors() -> None:
    vector = json.loads((VECTORS / "policy-documents.json").read_text())
    for case in vector["valid"]:
        assert parse_policy(case["document"]).document() == case["reads_as"], case["document"]
    for case in vector["invalid"]:
        with pytest.raises(PolicyError):
            parse_policy(case["document"])
    assert any("repeats a clause" in case["why"] for case in vector["invalid"])


@pytest.mark.offline
def test_encoding_vector_is_rfc8785_and_signatures_verify() -> None:
    encoding = json.loads((VECTORS / "encoding.json").read_text())
    keys = json.loads((VECTORS / "keys.json").read_text())["keys"]
    public = {entry["key_id"]: PublicKey(b64url_decode(entry["public_key"], 32)) for entry in keys.values()}
    path = Path.from_json(json.loads((VECTORS / "valid" / "signed-dag.json").read_text())["presentation"]["path"])
    for entry, envelope in zip(encoding["records"], path.envelopes, strict=True):
        record_bytes = entry["record_canonical"].encode()
        assert rfc8785.dumps(parse_json(record_bytes)) == record_bytes
        signing_input = base64.b64decode(entry["signing_input_base64"])
        assert signing_input == pae(PAYLOAD_TYPE_NODE, record_bytes)
        assert public[envelope.key_id].verify(signing_input, b64url_decode(entry["sig"], 64))
        envelope_bytes = entry["envelope_canonical"].encode()
        assert rfc8785.dumps(parse_json(envelope_bytes)) == envelope_bytes
        assert sha256_digest(envelope_bytes) == entry["envelope_digest"]
        if "edge_manifest" in entry:
            manifest = entry["edge_manifest"].encode()
            assert rfc8785.dumps(parse_json(manifest)) == manifest
            assert base64.b64decode(entry["edge_signing_input_base64"]) == pae(PAYLOAD_TYPE_EDGE, manifest)
            for cosig in entry["cosigs"]:
                assert public[cosig["key_id"]].verify(pae(PAYLOAD_TYPE_EDGE, manifest), b64url_decode(cosig["sig"], 64))
