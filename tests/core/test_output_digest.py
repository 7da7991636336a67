"""An output presented by its SHA-256 gets the verdict its bytes get (ADR 0027), and the receive
budget that bounds large requests in the daemons gives back what it takes."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from countersign._daemon.server import ReceiveBudget
from countersign.records import Path
from countersign.registry import Registry
from countersign.state import InMemoryState
from countersign.verify import Mode, OutputDigest, VerifierPolicy, output_digest, verify_path

from .strategies import MESH, NOW_MS, valid_paths

pytestmark = pytest.mark.offline

BASELINES = VerifierPolicy.unsafe_allow_baselines()
REGISTRY = Registry(MESH.registry.deployers, 7)


def _verdict(path: Path, output: bytes | OutputDigest, mode: Mode = Mode.ACCEPT) -> tuple[object, ...]:
    result = verify_path(
        path, output, registry=REGISTRY, state=InMemoryState(), mode=mode, now_ms=NOW_MS, policy=BASELINES
    )
    return (result.verdict, result.reason, result.index, result.detail, result.attribution)


@given(valid_paths(), st.binary(max_size=64), st.sampled_from(list(Mode)))
def test_a_digest_gets_the_verdict_of_its_bytes(case: tuple[Path, bytes], other: bytes, mode: Mode) -> None:
    path, output = case
    assert _verdict(path, OutputDigest.of(output), mode) == _verdict(path, output, mode)
    assert _verdict(path, OutputDigest.of(other), mode) == _verdict(path, other, mode)  # OUTPUT_MISMATCH unless equal


@given(valid_paths(), st.integers(0, 31), st.integers(1, 255))
def test_any_changed_byte_of_the_digest_is_a_mismatch(case: tuple[Path, bytes], position: int, flip: int) -> None:
    path, output = case
    digest = bytearray(hashlib.sha256(output).digest())
    digest[position] ^= flip
    verdict = _verdict(path, OutputDigest(bytes(digest)))
    assert verdict[1] is not None and verdict[1].value == "OUTPUT_MISMATCH"


@pytest.mark.parametrize("size", [0, 16, 31, 33, 64])
def test_a_digest_is_exactly_32_bytes(size: int) -> None:
    with pytest.raises(ValueError, match="32 bytes"):
        OutputDigest(b"\0" * size)


def test_the_hex_form_matches_the_records_digest_form() -> None:
    assert (
        output_digest(b"abc")
        == output_digest(OutputDigest.of(b"abc"))
        == "sha256:" + hashlib.sha256(b"abc").hexdigest()
    )


def test_the_receive_budget_refuses_past_capacity_and_gets_every_release_back_once() -> None:
    budget = ReceiveBudget(capacity=100, threshold=10)
    small = budget.take(9)
    assert small is not None and budget.held == 0  # small messages are free
    first, second = budget.take(60), budget.take(40)
    assert first is not None and second is not None and budget.held == 100
    assert budget.take(10) is None  # over the capacity: refused, nothing held
    first()
    first()  # a second release of the same reservation gives nothing back twice
    assert budget.held == 40
    assert budget.take(60) is not None and budget.held == 100
    second()
    assert budget.held == 60


@given(st.lists(st.tuples(st.integers(0, 200), st.booleans()), max_size=40))
def test_the_budget_never_holds_more_than_its_capacity_and_returns_to_zero(steps: list[tuple[int, bool]]) -> None:
    budget = ReceiveBudget(capacity=300, threshold=10)
    releases = []
    for size, release_one in steps:
        taken = budget.take(size)
        if taken is not None:
            releases.append(taken)
        assert 0 <= budget.held <= 300
        if release_one and releases:
            releases.pop(0)()
    for release in releases:
        release()
    assert budget.held == 0
