"""A verifier's replay state and verdict log may live in different backends (issue 31): a backend
implements one protocol or both, the verifier takes its replay state from ``store_url`` and its verdict
log from ``verdict_log_url`` or, when that is empty, from ``store_url``'s backend. In process, on the
in-memory references and SQLite files in tmp_path."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import prometheus_client
import pytest

from countersign._proto.v1 import verifier_pb2
from countersign.plugins import Plugin
from countersign.state import (
    ChildEdge,
    InMemoryReplayState,
    InMemoryState,
    InMemoryVerdictLog,
    LeafNonce,
    ReplayState,
    VerdictLog,
    VerifierStore,
)
from countersign.verify import DEFAULT_POLICY
from tests.stores.test_verdict_log import entry
from tests.verifier.test_verdict_recording import MESH, Context, Follower, fresh_path, registry, request
from verifier import stores
from verifier.daemon import VerifierMetrics, VerifierService
from verifier.stores import StoreConfigError, VerifierStores, open_store, open_verifier_stores
from verifier.verdict_log import VerdictLogMetrics, VerdictRecorder

pytestmark = pytest.mark.offline

RETAIN = 10**13


@pytest.fixture
def only_one_role(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two backends that each keep one thing, registered as a plug-in would register them."""
    table = dict(stores.STORE_FOR_SCHEME)
    table["replay-only"] = Plugin(lambda url: InMemoryReplayState(), "replay-only:", "replay state alone")
    table["log-only"] = Plugin(lambda url: InMemoryVerdictLog(), "log-only:", "a verdict log alone")
    monkeypatch.setattr(stores, "STORE_FOR_SCHEME", table)


def test_each_reference_implements_its_protocol_alone_and_the_backends_both() -> None:
    assert isinstance(InMemoryReplayState(), ReplayState) and not isinstance(InMemoryReplayState(), VerdictLog)
    assert isinstance(InMemoryVerdictLog(), VerdictLog) and not isinstance(InMemoryVerdictLog(), ReplayState)
    assert isinstance(InMemoryState(), VerifierStore)


def test_one_url_whose_backend_keeps_both_is_opened_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'both.db'}"
    for log_url in ("", url):
        opened = open_verifier_stores(url, log_url)
        try:
            assert opened.replay is opened.verdict_log
            assert opened.backends() == [opened.replay]
        finally:
            opened.close()


def test_replay_state_and_verdict_log_in_two_stores_each_hold_only_their_own(tmp_path: Path) -> None:
    replay_file, log_file = tmp_path / "replay.db", tmp_path / "log.db"
    opened = open_verifier_stores(f"sqlite:///{replay_file}", f"sqlite:///{log_file}")
    try:
        assert len(opened.backends()) == 2
        metrics = prometheus_client.CollectorRegistry()
        follower = Follower(registry(3))
        log_metrics = VerdictLogMetrics(metrics, opened.verdict_log)
        recorder = VerdictRecorder(
            opened.verdict_log, log_metrics, VerifierMetrics(metrics, follower).errors,  # type: ignore[arg-type]
            lambda: follower.view()[0], enabled=True, retention_ms=60_000,
        )  # fmt: skip
        verifier = VerifierService(
            state=opened.replay, follower=follower, policy=DEFAULT_POLICY,  # type: ignore[arg-type]
            metrics=VerifierMetrics(prometheus_client.CollectorRegistry(), follower),  # type: ignore[arg-type]
            verdicts=recorder, verdict_log_metrics=log_metrics, require_identity=False, verdict_log=opened.verdict_log,
        )  # fmt: skip
        path = fresh_path()
        assert verifier.VerifyPath(request(path), Context()).verdict.verdict == 1
        assert verifier.VerifyPath(request(path), Context()).verdict.reason == "NONCE_REPLAYED"
        answer = verifier.Impact(request_impact(), Context())
        assert len(answer.verdicts) == 1  # Impact reads the verdict log's store
    finally:
        opened.close()

    def rows(file: Path, table: str) -> int:
        with sqlite3.connect(file) as db:
            return int(db.execute(f"SELECT count(*) FROM {table}").fetchone()[0])

    assert (rows(replay_file, "consumed_nonces"), rows(replay_file, "verdict_log")) == (1, 0)
    assert (rows(log_file, "consumed_nonces"), rows(log_file, "verdict_log")) == (0, 2)


def request_impact() -> verifier_pb2.ImpactRequest:
    return verifier_pb2.ImpactRequest(key_id=MESH.signers["deployer-a"].key_id)


def test_a_backend_keeping_only_replay_state_needs_a_verdict_log_url(only_one_role: None, tmp_path: Path) -> None:
    with pytest.raises(StoreConfigError, match="keeps no verdict log: name one in verdict_log_url"):
        open_verifier_stores("replay-only:")
    paired = open_verifier_stores("replay-only:", f"sqlite:///{tmp_path / 'log.db'}")
    assert isinstance(paired.replay, InMemoryReplayState) and isinstance(paired.verdict_log, VerdictLog)
    paired.close()
    # Recording nothing, it needs no log: Impact then reads an empty one.
    quiet = open_verifier_stores("replay-only:", recording=False)
    assert isinstance(quiet.verdict_log, InMemoryVerdictLog) and quiet.verdict_log.verdict_count() == 0


def test_a_backend_keeping_only_a_verdict_log_cannot_be_the_store_url(only_one_role: None) -> None:
    with pytest.raises(StoreConfigError, match="keeps no replay state"):
        open_verifier_stores("log-only:", "memory:")
    with pytest.raises(StoreConfigError, match="keeps no verdict log"):
        open_verifier_stores("memory:", "replay-only:")
    with pytest.raises(StoreConfigError, match="keeps no replay state and verdict log together"):
        open_store("log-only:")
    assert isinstance(stores.open_verdict_log("log-only:"), InMemoryVerdictLog)
    assert isinstance(stores.open_replay_state("replay-only:"), InMemoryReplayState)


def test_collection_runs_once_on_each_backend() -> None:
    replay, log = InMemoryReplayState(), InMemoryVerdictLog()
    assert replay.admit([ChildEdge("p", "c", 2, 5, 1)], LeafNonce("n", 5, 1), consume=True, now_ms=0) is None
    log.record_verdicts([entry(1, (), verdict="REJECT", reason="MALFORMED", retain=5)])
    split = VerifierStores(replay, log)
    assert split.collect_expired(10, limit=1) == 1  # one of the two replay entries; the verdict
    assert (replay.entry_count(), log.verdict_count()) == (1, 0)
    assert split.collect_expired(10) == 1 and replay.entry_count() == 0
    both = InMemoryState()
    assert VerifierStores(both, both).backends() == [both]
