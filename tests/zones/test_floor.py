"""``zones measure``'s floors: the raw one counts what the protocol really does, and both measure the
routes they name.

A floor is only worth printing if its counts follow the protocol (a change that adds a signature
to issuance must move the floor too), if its round trips really cross the routes they name, and (the
design floor) if the handlers it times are the daemons' own, doing the whole of their work.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from bench.core import RecordingSignatures
from bench.issuance import in_process_issuance
from countersign.keys import Ed25519Signer, PublicKey
from countersign.samples import SampleMesh
from countersign.state import InMemoryState
from countersign.verify import Mode, VerifierPolicy, verify_path
from tools.zones import floor as floor_module
from tools.zones.evidence import signed_paths
from tools.zones.floor import (
    ISSUANCE_CHECKS,
    ISSUANCE_SIGNS,
    PATH_SIGNATURES,
    WARMUP,
    HandlerCosts,
    RawCosts,
    accept_ms,
    measure_handlers,
    measure_raw,
    median_ms,
    signature_lanes,
)
from tools.zones.measure import VERIFICATIONS, ProfileResult, Series, report, verdict
from verifier.daemon import signature_batch
from verifier.stores import open_store

COSTS = RawCosts(
    sign_ms=0.02, verify_ms=0.05, fsync_ms=0.3, grpc_local_ms=0.4, grpc_route_ms=1.4,
    postgres_local_ms=0.2, postgres_route_ms=1.2,
)  # fmt: skip
HANDLERS = HandlerCosts(issuance_ms=1.5, accept_local_ms=2.5, accept_route_ms=3.5, idle_ms=0.5)
HANDLERS_HOT = HandlerCosts(issuance_ms=0.75, accept_local_ms=2.25, accept_route_ms=3.25)


@pytest.mark.offline
def test_the_issuance_floor_counts_the_signatures_one_issuance_makes(monkeypatch: pytest.MonkeyPatch) -> None:
    """One more (grant, co-signed delegation) through the real handlers makes exactly the signatures
    and checks the floor charges for.

    Only this thread's calls count: the handlers run on it, while a session-scoped mesh in the same
    worker keeps signing registry checkpoints on its own thread."""
    calls = {"sign": 0, "verify": 0}
    sign, verify = Ed25519Signer.sign, PublicKey.verify
    caller = threading.get_ident()

    def counting_sign(self: Ed25519Signer, message: bytes) -> bytes:
        calls["sign"] += threading.get_ident() == caller
        return sign(self, message)

    def counting_verify(self: PublicKey, message: bytes, signature: bytes) -> bool:
        calls["verify"] += threading.get_ident() == caller
        return verify(self, message, signature)

    monkeypatch.setattr(Ed25519Signer, "sign", counting_sign)
    monkeypatch.setattr(PublicKey, "verify", counting_verify)
    counts = []
    for issuances in (1, 2):
        calls.update(sign=0, verify=0)
        in_process_issuance(issuances)
        counts.append(dict(calls))
    assert counts[1]["sign"] - counts[0]["sign"] == ISSUANCE_SIGNS
    assert counts[1]["verify"] - counts[0]["verify"] == ISSUANCE_CHECKS


@pytest.mark.offline
def test_the_verification_floor_counts_the_signatures_of_the_measured_path() -> None:
    """``zones measure`` verifies depth-5 SIGNED-DAG paths from ``signed_paths``; verifying one checks
    exactly ``PATH_SIGNATURES`` signatures."""
    keys = {name: Ed25519Signer.generate() for name in ("deployer-a", "deployer-b", "deployer-c")}
    (item,) = signed_paths(keys, 1, depth=5)
    recorder = RecordingSignatures()
    result = verify_path(
        item.path, item.output, registry=SampleMesh(dict(keys)).registry, state=InMemoryState(), mode=Mode.AUDIT,
        now_ms=item.path.leaf.record.created_ms, policy=VerifierPolicy(), signatures=recorder,
    )  # fmt: skip
    assert result, result
    assert len(recorder.checks) == PATH_SIGNATURES


@pytest.mark.offline
def test_floors_add_the_costs_each_call_cannot_avoid() -> None:
    crypto = ISSUANCE_SIGNS * COSTS.sign_ms + ISSUANCE_CHECKS * COSTS.verify_ms
    assert math.isclose(COSTS.issuance_floor(), 0.4 + 1.4 + crypto + 0.3)
    signatures = PATH_SIGNATURES * COSTS.verify_ms
    floor = COSTS.verification_floor
    assert math.isclose(floor(client_remote=False, database_remote=False), 0.4 + signatures + 0.2 + 0.3)
    assert math.isclose(floor(client_remote=True, database_remote=False), 1.4 + signatures + 0.2 + 0.3)
    assert math.isclose(floor(client_remote=False, database_remote=True), 0.4 + signatures + 1.2 + 0.3)
    assert math.isclose(floor(client_remote=True, database_remote=True), 1.4 + signatures + 1.2 + 0.3)


@pytest.mark.offline
def test_a_verifier_that_splits_its_checks_is_held_to_its_longest_lane(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the checks split over lanes, the floor counts the longest lane's share (7 of 13 on two
    lanes), and the lanes are what the daemon would use: no more than the threads, the CPUs or half
    the checks allow."""
    split = dataclasses.replace(COSTS, signature_lanes=2)
    assert math.isclose(
        split.verification_floor(client_remote=False, database_remote=False), 0.4 + 7 * COSTS.verify_ms + 0.2 + 0.3
    )
    assert math.isclose(dataclasses.replace(COSTS, signature_lanes=13).verification_floor(
        client_remote=True, database_remote=True), 1.4 + COSTS.verify_ms + 1.2 + 0.3)  # fmt: skip
    for cpus, threads, lanes in ((2, 1, 1), (2, 2, 2), (2, 16, 2), (1, 2, 1), (64, 16, PATH_SIGNATURES // 2)):
        monkeypatch.setattr(floor_module, "usable_cpus", lambda cpus=cpus: cpus)
        assert signature_lanes(threads) == lanes, (cpus, threads)


@pytest.mark.offline
def test_design_floors_add_the_handlers_to_one_round_trip_per_hop() -> None:
    assert math.isclose(HANDLERS.issuance_floor(COSTS), 0.4 + 1.4 + 1.5)
    floor = HANDLERS.verification_floor
    assert math.isclose(floor(COSTS, client_remote=False, database_remote=False), 0.4 + 2.5)
    assert math.isclose(floor(COSTS, client_remote=True, database_remote=False), 1.4 + 2.5)
    assert math.isclose(floor(COSTS, client_remote=False, database_remote=True), 0.4 + 3.5)
    assert math.isclose(floor(COSTS, client_remote=True, database_remote=True), 1.4 + 3.5)


@pytest.mark.offline
@pytest.mark.parametrize("threads", [1, 2])
def test_the_verifier_handler_floor_times_real_accepts(tmp_path: Path, threads: int) -> None:
    """``accept_ms`` verifies and consumes a fresh valid path per call, in the store the named zone's
    verifiers open, checking signatures as the daemon would: afterwards that store holds every path's
    nonce and its four edges (warm-up calls included), and the other zone's store holds nothing."""
    keys = {name: Ed25519Signer.generate() for name in ("deployer-a", "deployer-b", "deployer-c")}
    urls = {zone: f"sqlite:///{tmp_path / zone}.db" for zone in ("a", "b")}
    zoned = SimpleNamespace(store_url=lambda zone: urls[zone])
    signatures = signature_batch(threads)
    try:
        median = accept_ms(zoned, "b", keys, 5, signatures)  # type: ignore[arg-type]
    finally:
        signatures.close()
    assert 0 < median < 1_000
    calls = 5 + WARMUP
    for zone, entries in (("a", 0), ("b", calls * (1 + 4))):  # one nonce and four child-set entries per path
        state = open_store(urls[zone])
        try:
            assert state.entry_count() == entries, zone
        finally:
            state.close()


@pytest.mark.offline
def test_the_verifier_handler_floor_refuses_to_time_rejections(tmp_path: Path) -> None:
    """A rejected path is not a verification to time: paths signed by keys the registry does not hold
    stop the measurement instead of timing an early rejection."""
    keys = {name: Ed25519Signer.generate() for name in ("deployer-a", "deployer-b", "deployer-c")}
    strangers = {name: Ed25519Signer.generate() for name in keys}
    zoned = SimpleNamespace(store_url=lambda zone: f"sqlite:///{tmp_path / zone}.db")
    real = floor_module.signed_paths
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(floor_module, "signed_paths", lambda _keys, count, depth: real(strangers, count, depth=depth))
        with pytest.raises(RuntimeError, match="rejected in process"):
            accept_ms(zoned, "a", keys, 3)  # type: ignore[arg-type]


@pytest.mark.offline
def test_the_report_puts_each_figure_beside_its_floor() -> None:
    result = ProfileResult("durable", raw=COSTS, handlers=HANDLERS, handlers_hot=HANDLERS_HOT)
    result.issuance = Series([4.0, 4.0])
    for _, _, label in VERIFICATIONS:
        result.verification[label] = Series([6.0])
    result.revocation = Series([12.0])
    text = report([result], command="python -m tools.zones measure", delay_ms=0.5, mode="auto", load="0", cpu="idle")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    issuance_floor = COSTS.issuance_floor()
    design_floor = HANDLERS.issuance_floor(COSTS)
    (issuance,) = [row for row in rows if "co-signed cross-deployer issuance" in row]
    assert issuance.endswith(
        f"| {issuance_floor:.3f} ({4.0 / issuance_floor:.2f}×) | {design_floor:.3f} ({4.0 / design_floor:.2f}×) |"
    ), issuance
    # verifier-0 is in the database's zone (a), the client in b: remote client, local database; and so on.
    placements = {
        VERIFICATIONS[0][2]: {"client_remote": True, "database_remote": False},
        VERIFICATIONS[1][2]: {"client_remote": False, "database_remote": True},
        VERIFICATIONS[2][2]: {"client_remote": True, "database_remote": True},
    }
    for label, placement in placements.items():
        floor, design = COSTS.verification_floor(**placement), HANDLERS.verification_floor(COSTS, **placement)
        (line,) = [row for row in rows if label in row]
        assert line.endswith(f"| {floor:.3f} ({6.0 / floor:.2f}×) | {design:.3f} ({6.0 / design:.2f}×) |"), line
    assert "this host's raw costs in this run" in text
    # the design floor is the woken handlers'; the back-to-back figures are printed beside them
    assert "in this run, each part after 0.5 ms idle: both signers' issuance handlers 1.500 ms" in text
    assert "in this run, back to back: both signers' issuance handlers 0.750 ms" in text
    bare = report([ProfileResult("durable")], command="c", delay_ms=0.5, mode="auto", load="0", cpu="idle")
    assert "raw costs" not in bare and "handlers called" not in bare
    assert all(row.endswith("| — | — |") for row in bare.splitlines() if row.startswith("| co-signed"))


@pytest.mark.offline
def test_woken_medians_time_the_call_and_not_the_idle_before_it() -> None:
    calls: list[float] = []
    started = time.perf_counter()
    median = median_ms(lambda: calls.append(time.perf_counter()), 5, idle_s=0.02)
    assert len(calls) == WARMUP + 5
    assert time.perf_counter() - started >= (WARMUP + 5) * 0.02  # it did idle before each call
    assert min(b - a for a, b in itertools.pairwise(calls)) >= 0.02
    assert 0 <= median < 1.0, median  # ms: the call alone, not the 20 ms before it


@pytest.mark.offline
def test_the_verdict_says_when_the_floor_itself_misses_the_target() -> None:
    assert verdict(3.0, 3.651, 2.0) == "below"
    assert verdict(4.0, 3.651, 2.0) == "ABOVE"
    assert verdict(4.0, 3.651, None) == "ABOVE"
    assert verdict(4.0, 3.651, 3.7) == "ABOVE (so is this host's floor)"
    assert verdict(4.0, 3.651, 3.7, 5.0) == "ABOVE (so is this host's floor)"  # the host's floor says more
    assert verdict(4.0, 3.651, 2.0, 3.7) == "ABOVE (so is this design's floor here)"
    assert verdict(4.0, 3.651, 2.0, 3.0) == "ABOVE"
    assert verdict(3.0, 3.651, 2.0, 3.7) == "below"
    slow_host = RawCosts(
        sign_ms=0.04, verify_ms=0.09, fsync_ms=0.25, grpc_local_ms=1.0, grpc_route_ms=2.2,
        postgres_local_ms=0.5, postgres_route_ms=1.2,
    )  # fmt: skip
    result = ProfileResult("durable", raw=slow_host)
    result.issuance = Series([7.0])
    text = report([result], command="c", delay_ms=0.5, mode="auto", load="0", cpu="idle")
    (issuance,) = [line for line in text.splitlines() if "co-signed cross-deployer issuance" in line]
    assert "| ABOVE (so is this host's floor) |" in issuance


@pytest.mark.netns
@pytest.mark.daemons
@pytest.mark.exclusive
@pytest.mark.slow
def test_raw_round_trips_cross_the_routes_they_name(make_zones, tmp_path) -> None:
    """With 10 ms one way on every route, the 'across a route' round trips pay about 20 ms more than
    the local ones, and the local ones pay no route at all. The margins leave room for a noisy host
    (a local round trip here has taken up to 1.4 ms) and none for a measurement of the wrong address."""
    zoned = make_zones(delay_ms=10.0)
    raw = measure_raw(zoned, tmp_path, count=20, signature_threads=2)
    assert raw.signature_lanes == signature_lanes(2)
    assert raw.grpc_route_ms - raw.grpc_local_ms > 15.0, raw
    assert raw.postgres_route_ms - raw.postgres_local_ms > 15.0, raw
    assert raw.grpc_local_ms < 10.0 and raw.postgres_local_ms < 10.0, raw
    assert 0 < raw.sign_ms < 1.0 and 0 < raw.verify_ms < 1.0 and raw.fsync_ms > 0, raw
    handlers = measure_handlers(zoned, tmp_path, count=10, signature_threads=2, idle_ms=1.0)  # woken, as printed
    assert handlers.idle_ms == 1.0
    assert handlers.accept_route_ms - handlers.accept_local_ms > 15.0, handlers  # the consume crosses the route
    assert 0 < handlers.issuance_ms < 100.0 and handlers.accept_local_ms < 50.0, handlers
