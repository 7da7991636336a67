"""The core benchmark's tables tell the truth: peers run or are marked unavailable (never a constant),
ratios are formed inside each round, the lanes table divides by a ceiling measured in its own round."""

from __future__ import annotations

import pytest

from bench import core
from bench.peers import biscuit_depth5, hdp_depth5
from countersign.records import Construction
from countersign.samples import SampleMesh, cross_deployer_route, deployer_names

pytestmark = pytest.mark.offline


def test_no_peer_figure_is_a_constant() -> None:
    assert not [name for name in dir(core) if name.startswith(("HDP_", "AIP_", "BISCUIT_"))]


@pytest.mark.parametrize("make_peer", [hdp_depth5, biscuit_depth5])
def test_a_peer_verifies_its_own_chain_or_says_why_it_cannot(make_peer: object) -> None:
    peer = make_peer()  # type: ignore[operator]
    if peer.verify is None:
        assert peer.unavailable  # the report prints the reason, and no figure
    else:
        assert peer.verify() is not None and peer.signatures == 5 and peer.size_bytes > 0


def test_ratio_stats_are_formed_per_round() -> None:
    stats = core.ratio_stats([2.0, 30.0, 4.0], [1.0, 10.0, 4.0])
    assert stats == {"median": 2.0, "low": 1.0, "high": 3.0}


def test_the_headline_runs_every_row_in_the_same_rounds() -> None:
    mesh = SampleMesh.create(deployer_names(3), seed=b"bench-test")
    head = core.headline(mesh, quick=True)
    assert head["signatures"] == 13
    for name in ("raw", "audit", "audit_sqlite", "audit_lanes", "accept", "parsed", "parsed_sqlite", "sibling",
                 "again", "commit", "json", "read"):  # fmt: skip
        assert head["median_us"][name] > 0
    assert head["ratio_to_raw"]["raw"]["median"] == 1.0
    assert head["accept_floor"]["median"] > 1.0  # the raw verifies plus a durable commit
    assert head["audit_floor"]["median"] > 1.0  # the raw verifies plus the walk and a plain read of the bytes
    assert head["audit_sqlite_floor"]["median"] > 1.0
    text = "\n".join(core.headline_report(head))
    assert "from bytes, audit" in text and "sibling under a cached depth-4 prefix" in text
    assert "audit, SQLite state" in text and f"≤ {core.TARGET_AUDIT_SQLITE}" in text
    # The peers come with the bench extra, which `make test` does not install: each says which it is.
    measured = [peer for peer in head["peers"].values() if peer["us"] is not None]
    assert ("signature floor" in text) == bool(measured)
    assert text.count(": unavailable, ") == len(head["peers"]) - len(measured)
    assert "the verifier service's split" in text
    for peer in head["peers"].values():
        assert (peer["us"] is None) == bool(peer["unavailable"])


def test_the_lanes_ceiling_is_measured_in_each_round(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake_throughput(call: object, clients: int, seconds: float) -> float:
        calls.append(clients)
        return 100.0 * clients

    monkeypatch.setattr(core, "throughput", fake_throughput)
    mesh = SampleMesh.create(deployer_names(3), seed=b"bench-test")
    dag5 = mesh.issue_path(
        Construction.SIGNED_DAG, cross_deployer_route(list(mesh.signers), 5), b"o", now_ms=core.NOW_MS
    )
    lanes = core.signature_lanes(dag5, mesh, quick=True)
    # Per round and client count: the ceiling first, then the three strategies.
    assert calls == [c for c in core.LANE_CLIENTS for _ in range(4)]
    assert lanes["ratio_to_ceiling"]["serial"] == dict.fromkeys(core.LANE_CLIENTS, 1.0)
    assert "ceiling (raw checks only)" in "\n".join(core.lanes_report(lanes))


def test_record_building_is_measured_beside_a_raw_signature_in_the_same_rounds() -> None:
    rows = core.record_building(quick=True)
    assert [row["construction"] for row in rows] == [c.value for c in core.BUILD_CONSTRUCTIONS]
    for row in rows:
        assert row["build_us"] > 0 and row["raw_us"] > 0
    text = "\n".join(core.building_report(rows))
    assert f"≤ {core.TARGET_BUILD_US:.0f} µs" in text and "besides its signature" in text
