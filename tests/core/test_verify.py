"""Path verification: mutations of a valid SIGNED-DAG path, order of checks, modes, keys, policy."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign.canonical import sha256_digest
from countersign.errors import PathRejected
from countersign.reasons import Reason, Verdict, VerificationResult
from countersign.records import Construction, Path
from countersign.registry import Registry
from countersign.state import InMemoryState
from countersign.verify import (
    DEFAULT_POLICY,
    Mode,
    SerialSignatures,
    VerifierPolicy,
    check_lineage,
    verify_path,
    verify_path_bytes,
)
from verifier.signature_threads import ThreadedSignatures

from .strategies import MESH, NOW_MS, valid_paths

pytestmark = pytest.mark.offline

DAG = st.just(Construction.SIGNED_DAG)
THREADED = ThreadedSignatures(2)


def run(
    data: bytes | Path,
    output: bytes,
    *,
    registry: Registry = MESH.registry,
    state: InMemoryState | None = None,
    mode: Mode = Mode.ACCEPT,
    policy: VerifierPolicy = DEFAULT_POLICY,
    signatures: object = None,
    now_ms: int = NOW_MS,
) -> VerificationResult:
    state = state or InMemoryState()
    batch = signatures or SerialSignatures()
    if isinstance(data, Path):
        return verify_path(
            data, output, registry=registry, state=state, mode=mode, now_ms=now_ms, policy=policy, signatures=batch
        )  # type: ignore[arg-type]
    return verify_path_bytes(
        data, output, registry=registry, state=state, mode=mode, now_ms=now_ms, policy=policy, signatures=batch
    )  # type: ignore[arg-type]


@given(valid_paths(constructions=DAG), st.data())
def test_flipping_any_byte_of_a_signed_dag_path_is_rejected(case: tuple[Path, bytes], data: st.DataObject) -> None:
    path, output = case
    encoded = bytearray(path.to_bytes())
    position = data.draw(st.integers(0, len(encoded) - 1), label="position")
    encoded[position] ^= data.draw(st.integers(1, 255), label="mask")
    assert run(bytes(encoded), output).verdict is Verdict.REJECT


def _leaves(value: object, trail: tuple = ()) -> list[tuple]:
    if isinstance(value, dict):
        return [leaf for key, child in value.items() for leaf in _leaves(child, (*trail, key))]
    if isinstance(value, list):
        return [leaf for index, child in enumerate(value) for leaf in _leaves(child, (*trail, index))]
    return [trail]


def _changed(value: object, draw: st.DataObject) -> object:
    """A different value of the same JSON type, staying inside the field's alphabet where possible."""
    if isinstance(value, bool) or value is None:
        return draw.draw(st.sampled_from(["x", 1, True]).filter(lambda v: v != value))
    if isinstance(value, int):
        return value + draw.draw(st.sampled_from([-1, 1]))
    assert isinstance(value, str)
    index = draw.draw(st.integers(0, len(value) - 1))
    alphabet = "0123456789abcdef" if value[index] in "0123456789abcdef" else "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
    replacement = draw.draw(st.sampled_from([c for c in alphabet if c != value[index]]))
    return value[:index] + replacement + value[index + 1 :]


@given(valid_paths(constructions=DAG), st.data())
def test_changing_any_signed_field_to_another_valid_value_is_rejected(
    case: tuple[Path, bytes], data: st.DataObject
) -> None:
    """Every leaf of every record (co-signatures included) and of every envelope is covered."""
    path, output = case
    document = path.to_json()
    leaves = [trail for trail in _leaves(document) if trail[0] == "envelopes"]
    trail = data.draw(st.sampled_from(leaves), label="field")
    target = document
    for step in trail[:-1]:
        target = target[step]  # type: ignore[index]
    target[trail[-1]] = _changed(target[trail[-1]], data)  # type: ignore[index]
    assert run(json.dumps(document).encode(), output).verdict is Verdict.REJECT


@given(valid_paths(), st.data())
def test_flipping_any_byte_of_the_output_is_rejected(case: tuple[Path, bytes], data: st.DataObject) -> None:
    path, output = case
    policy = VerifierPolicy.unsafe_allow_baselines()
    if output:
        changed = bytearray(output)
        changed[data.draw(st.integers(0, len(output) - 1))] ^= data.draw(st.integers(1, 255))
    else:
        changed = bytearray(b"\x00")
    result = run(path, bytes(changed), policy=policy)
    assert (result.verdict, result.reason) == (Verdict.REJECT, Reason.OUTPUT_MISMATCH)


@given(valid_paths(), st.data())
def test_threaded_signatures_give_exactly_the_serial_verdict(case: tuple[Path, bytes], data: st.DataObject) -> None:
    path, output = case
    encoded = bytearray(path.to_bytes())
    if data.draw(st.booleans(), label="mutate"):
        encoded[data.draw(st.integers(0, len(encoded) - 1))] ^= data.draw(st.integers(1, 255))
    policy = VerifierPolicy.unsafe_allow_baselines()
    serial = run(bytes(encoded), output, policy=policy, mode=Mode.AUDIT)
    threaded = run(bytes(encoded), output, policy=policy, mode=Mode.AUDIT, signatures=THREADED)
    assert serial == threaded


def _dag(deployers: list[str], output: bytes = b"out", **kw: object) -> Path:
    return MESH.issue_path(Construction.SIGNED_DAG, deployers, output, now_ms=NOW_MS, **kw)  # type: ignore[arg-type]


def test_accept_consumes_and_audit_does_not() -> None:
    path = _dag(["deployer-a", "deployer-b"])
    state = InMemoryState()
    assert run(path, b"out", state=state, mode=Mode.AUDIT)
    assert run(path, b"out", state=state, mode=Mode.AUDIT)
    assert run(path, b"out", state=state)
    replay = run(path, b"out", state=state)
    assert (replay.reason, replay.index) == (Reason.NONCE_REPLAYED, 1)
    assert run(path, b"out", state=state, mode=Mode.AUDIT), "audit still accepts a consumed path"


def test_fanout_counts_distinct_children_and_audit_does_not_record() -> None:
    trunk = _dag(["deployer-a"], max_children=2)
    children = [_dag(["deployer-b"], prefix=trunk.envelopes) for _ in range(3)]
    state = InMemoryState()
    assert run(children[0], b"out", state=state, mode=Mode.AUDIT)
    assert run(children[1], b"out", state=state, mode=Mode.AUDIT)
    assert run(children[2], b"out", state=state, mode=Mode.AUDIT), "audit recorded nothing yet"
    assert run(children[0], b"out", state=state)
    assert run(children[1], b"out", state=state)
    third = run(children[2], b"out", state=state)
    assert (third.reason, third.index) == (Reason.FANOUT_EXCEEDED, 1)
    audit_third = run(children[2], b"out", state=state, mode=Mode.AUDIT)
    assert audit_third.reason is Reason.FANOUT_EXCEEDED
    again = run(children[0], b"out", state=state)
    assert again.reason is Reason.NONCE_REPLAYED, "a known child is not a new child"


def test_baselines_are_refused_unless_explicitly_allowed() -> None:
    for construction in (Construction.NO_CHAIN, Construction.HASH_ONLY, Construction.NAIVE_SIG):
        path = MESH.issue_path(construction, ["deployer-a"], b"out", now_ms=NOW_MS)
        assert run(path, b"out").reason is Reason.CONSTRUCTION_NOT_ALLOWED
        assert run(path, b"out", policy=VerifierPolicy.unsafe_allow_baselines())


def test_clock_skew_bounds() -> None:
    path = _dag(["deployer-a"], ttl_ms=10_000)
    expires = path.leaf.record.expires_ms
    skew = DEFAULT_POLICY.clock_skew_ms
    assert run(path, b"out", now_ms=expires + skew - 1, mode=Mode.AUDIT)
    assert run(path, b"out", now_ms=expires + skew, mode=Mode.AUDIT).reason is Reason.EXPIRED
    created = path.leaf.record.created_ms
    assert run(path, b"out", now_ms=created - skew, mode=Mode.AUDIT)
    assert run(path, b"out", now_ms=created - skew - 1, mode=Mode.AUDIT).reason is Reason.NOT_YET_VALID


def test_key_validity_window_and_revocation() -> None:
    path = _dag(["deployer-a", "deployer-b"])
    created = path.leaf.record.created_ms

    def with_b(**status: int) -> Registry:
        keys = {k: replace(e, **status) for k, e in MESH.registry.deployers["deployer-b"].items()}  # type: ignore[arg-type]
        return Registry({**MESH.registry.deployers, "deployer-b": keys})

    assert run(path, b"out", registry=with_b(retired_ms=created + 1), mode=Mode.AUDIT)
    assert run(path, b"out", registry=with_b(retired_ms=created), mode=Mode.AUDIT).reason is Reason.KEY_NOT_VALID
    assert run(path, b"out", registry=with_b(added_ms=created + 1), mode=Mode.AUDIT).reason is Reason.KEY_NOT_VALID
    revoked = run(path, b"out", registry=with_b(revoked_ms=0), mode=Mode.AUDIT)
    assert (revoked.reason, revoked.index) == (Reason.KEY_REVOKED, 1)


def test_first_violation_in_path_order_wins() -> None:
    """A bad signature at index 1 is reported before a parent mismatch at index 2."""
    path = _dag(["deployer-a", "deployer-b", "deployer-c"])
    document = path.to_json()
    document["envelopes"][1]["record"]["agent"]["instance"] = "tampered"  # type: ignore[index]
    document["envelopes"][2]["record"]["parent"] = sha256_digest(b"elsewhere")  # type: ignore[index]
    result = run(json.dumps(document).encode(), b"out", mode=Mode.AUDIT)
    assert (result.reason, result.index) == (Reason.BAD_SIGNATURE, 1)


def test_raising_convenience_call_carries_the_result() -> None:
    path = _dag(["deployer-a"])
    result = run(path, b"other")
    with pytest.raises(PathRejected) as raised:
        result.raise_for_reject()
    assert raised.value.result.reason is Reason.OUTPUT_MISMATCH
    run(path, b"out").raise_for_reject()


def test_lineage_only_check_skips_primary_signatures_but_not_cosignatures() -> None:
    path = _dag(["deployer-a", "deployer-b"])
    document = path.to_json()
    sig = document["envelopes"][1]["sig"]  # type: ignore[index]
    document["envelopes"][1]["sig"] = ("A" if sig[0] != "A" else "B") + sig[1:]  # type: ignore[index]
    tampered = Path.from_json(document)
    assert check_lineage(tampered, registry=MESH.registry, now_ms=NOW_MS)
    assert run(tampered, b"out").reason is Reason.BAD_SIGNATURE
    cosig = document["envelopes"][1]["record"]["cosigs"][0]  # type: ignore[index]
    cosig["sig"] = ("A" if cosig["sig"][0] != "A" else "B") + cosig["sig"][1:]
    assert (
        check_lineage(Path.from_json(document), registry=MESH.registry, now_ms=NOW_MS).reason is Reason.BAD_COSIGNATURE
    )


def test_one_deployer_cannot_use_up_another_deployers_nonce() -> None:
    """Consumed nonces live in their issuer's namespace: a front-running record with the victim's
    nonce by another admitted deployer does not make the victim's path a replay."""
    victim = _dag(["deployer-a"])
    nonce = victim.leaf.record.nonce
    squatter = MESH.issue_path(Construction.SIGNED_DAG, ["deployer-b"], b"out", now_ms=NOW_MS, nonces=[nonce])
    state = InMemoryState()
    assert run(squatter, b"out", state=state)
    assert run(victim, b"out", state=state)
    assert run(victim, b"out", state=state).reason is Reason.NONCE_REPLAYED


def test_registry_refuses_one_key_for_two_deployers() -> None:
    from countersign.errors import MalformedError

    document = MESH.registry.to_json()
    deployers = document["deployers"]  # type: ignore[index]
    deployers["deployer-b"]["keys"].append(deployers["deployer-a"]["keys"][0])  # type: ignore[index]
    with pytest.raises(MalformedError, match="registered to deployer-a and deployer-b"):
        Registry.from_json(document)


def test_negative_clock_skew_is_refused() -> None:
    with pytest.raises(ValueError, match="clock_skew_ms"):
        VerifierPolicy(clock_skew_ms=-1)
