"""Verdicts that say what they prove: the emitter, every edge, the registry sequence (spec 6.2)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.reasons import Attribution, Reason, Verdict, VerificationResult
from countersign.records import Construction, Envelope, Path
from countersign.registry import Registry
from countersign.state import InMemoryState
from countersign.verify import Mode, VerifierPolicy, verify_path, verify_path_bytes

from .strategies import MESH, NOW_MS, valid_paths

pytestmark = pytest.mark.offline

BASELINES = VerifierPolicy.unsafe_allow_baselines()
SEQUENCED = Registry(MESH.registry.deployers, 42)


def verify(
    path: Path, output: bytes, state: InMemoryState | None = None, mode: Mode = Mode.ACCEPT
) -> VerificationResult:
    return verify_path(
        path, output, registry=SEQUENCED, state=state or InMemoryState(), mode=mode, now_ms=NOW_MS, policy=BASELINES
    )


def proven(result: VerificationResult) -> Attribution:
    assert result.attribution is not None, result
    return result.attribution


@given(valid_paths())
def test_an_accept_names_the_leaf_as_emitter_and_every_edge_in_order(case: tuple[Path, bytes]) -> None:
    path, output = case
    result = verify(path, output)
    assert result.verdict is Verdict.ACCEPT
    attribution = proven(result)
    records = [e.record for e in path.envelopes]
    leaf = records[-1]
    assert leaf.output is not None
    emitter = attribution.emitter
    assert (emitter.index, emitter.deployer, emitter.key_id) == (len(path) - 1, leaf.deployer, leaf.key_id)
    assert (emitter.agent_instance, emitter.agent_system) == (leaf.agent.instance, leaf.agent.system)
    assert (emitter.session, emitter.seq, emitter.binding_scope) == (
        leaf.output.session,
        leaf.output.seq,
        leaf.output.binding_scope,
    )
    assert (emitter.output_sha256, emitter.created_ms, emitter.construction) == (
        leaf.output.sha256,
        leaf.created_ms,
        leaf.construction,
    )
    assert [edge.index for edge in attribution.edges] == list(range(1, len(path)))
    for edge, parent, child in zip(attribution.edges, records[:-1], records[1:], strict=True):
        assert (edge.parent_deployer, edge.parent_key_id) == (parent.deployer, parent.key_id)
        assert (edge.deployer, edge.key_id, edge.construction) == (child.deployer, child.key_id, child.construction)
        assert edge.cross_deployer is (parent.deployer != child.deployer)
        assert edge.cosigners == child.cosigs
        if child.construction is Construction.SIGNED_DAG:
            # verification proved both co-signatures on every cross edge, and none elsewhere
            assert bool(edge.cosigners) is edge.cross_deployer
    assert attribution.registry_sequence == 42


@given(valid_paths(constructions=st.just(Construction.SIGNED_DAG)))
def test_the_verdict_json_keeps_its_four_fields_and_adds_the_attribution(case: tuple[Path, bytes]) -> None:
    path, output = case
    verdict = json.loads(json.dumps(verify(path, output).to_json()))
    assert {k: verdict[k] for k in ("verdict", "reason", "index", "detail")} == {
        "verdict": "ACCEPT",
        "reason": None,
        "index": None,
        "detail": "",
    }
    leaf = path.leaf.record
    assert verdict["emitter"]["deployer"] == leaf.deployer
    assert verdict["emitter"]["key_id"] == leaf.key_id
    assert verdict["emitter"]["agent_instance"] == leaf.agent.instance
    assert verdict["emitter"]["construction"] == "signed-dag"
    assert verdict["registry_sequence"] == 42
    assert len(verdict["edges"]) == len(path) - 1
    for edge, envelope in zip(verdict["edges"], path.envelopes[1:], strict=True):
        assert edge["cosigners"] == [c.cosigner_json() for c in envelope.record.cosigs]
        assert all("sig" not in c for c in edge["cosigners"])


@given(valid_paths(constructions=st.sampled_from([Construction.LINKED_LIST, Construction.SIGNED_DAG])))
def test_replay_and_audit_carry_the_same_attribution_as_the_accept(case: tuple[Path, bytes]) -> None:
    path, output = case
    state = InMemoryState()
    first = verify(path, output, state)
    replay = verify(path, output, state)
    audit = verify(path, output, state, Mode.AUDIT)
    assert replay.reason is Reason.NONCE_REPLAYED
    assert audit.verdict is Verdict.ACCEPT
    assert first.attribution == replay.attribution == audit.attribution is not None


def test_fanout_exceeded_carries_the_attribution_of_the_refused_child() -> None:
    trunk = MESH.issue_path(Construction.SIGNED_DAG, ["deployer-a"], b"", now_ms=NOW_MS, max_children=1)
    children = [
        MESH.issue_path(Construction.SIGNED_DAG, ["deployer-b"], b"child %d" % i, now_ms=NOW_MS, prefix=trunk.envelopes)
        for i in range(2)
    ]
    state = InMemoryState()
    assert verify(children[0], b"child 0", state)
    refused = verify(children[1], b"child 1", state)
    assert (refused.reason, refused.index) == (Reason.FANOUT_EXCEEDED, 1)
    assert proven(refused).emitter.output_sha256 == children[1].leaf.record.output.sha256  # type: ignore[union-attr]


def _resealed_with_changed_agent(path: Path) -> Path:
    leaf = path.leaf
    changed = replace(leaf.record, agent=replace(leaf.record.agent, instance="someone-else"))
    return Path((*path.envelopes[:-1], Envelope.build(changed, leaf.sig)))


@given(valid_paths(constructions=st.just(Construction.SIGNED_DAG)))
def test_a_reject_before_the_output_is_proven_names_nobody(case: tuple[Path, bytes]) -> None:
    path, output = case
    substituted = verify(path, output + b"!")
    forged = verify(_resealed_with_changed_agent(path), output)
    malformed = verify_path_bytes(
        path.to_bytes()[:-3], output, registry=SEQUENCED, state=InMemoryState(), mode=Mode.ACCEPT, now_ms=NOW_MS
    )
    assert substituted.reason is Reason.OUTPUT_MISMATCH
    assert forged.reason is Reason.BAD_SIGNATURE
    assert malformed.reason is Reason.MALFORMED
    for rejected in (substituted, forged, malformed):
        assert rejected.attribution is None
        verdict = rejected.to_json()
        assert (verdict["emitter"], verdict["edges"], verdict["registry_sequence"]) == (None, None, None)


def test_a_one_record_path_has_an_emitter_and_no_edges() -> None:
    path = MESH.issue_path(Construction.SIGNED_DAG, ["deployer-c"], b"alone", now_ms=NOW_MS)
    attribution = proven(verify(path, b"alone"))
    assert attribution.edges == ()
    assert (attribution.emitter.index, attribution.emitter.deployer) == (0, "deployer-c")
    assert verify(path, b"alone").to_json()["edges"] == []


@given(valid_paths())
def test_the_attributions_fast_constructors_make_what_the_classes_make(case: tuple[Path, bytes]) -> None:
    """The emitter and the edges are built without their generated ``__init__`` (new_emitter,
    new_proven_edge): each is of its class and equals, hashes and prints as the object the class builds."""
    path, output = case
    attribution = proven(verify(path, output))
    made = [attribution.emitter, *attribution.edges]
    built = [type(item)(*(getattr(item, name) for name in type(item).__slots__)) for item in made]
    for fast, slow in zip(made, built, strict=True):
        assert type(fast) is type(slow) and fast == slow and hash(fast) == hash(slow) and repr(fast) == repr(slow)
