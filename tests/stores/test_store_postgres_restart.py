"""Restart the real PostgreSQL server under load (this machine's cluster, via pg_ctlcluster, as root).

While the server is down every admit raises StateUnavailable within the connect timeout; once it is
back the same store object serves again without being reopened; no nonce consumed before or during
the load is forgotten, and none is accepted twice. The server is started again even if the test fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from countersign.errors import StateUnavailable
from countersign.reasons import Reason
from countersign.state import ChildEdge, LeafNonce
from tests.stores.conftest import PostgresSchemas
from verifier.stores import open_store

pytestmark = pytest.mark.postgres

RETAIN = 10**13
LOAD_THREADS = 4


def _cluster() -> list[str]:
    if os.geteuid() != 0 or shutil.which("pg_ctlcluster") is None:
        pytest.fail("the restart test needs root and pg_ctlcluster (this machine's PostgreSQL cluster)", pytrace=False)
    versions = sorted(p.name for p in Path("/etc/postgresql").iterdir() if p.is_dir())
    if not versions:
        pytest.fail("no PostgreSQL cluster under /etc/postgresql", pytrace=False)
    return [versions[-1], "main"]


def _ctl(action: str, cluster: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, action],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _ensure_running(cluster: list[str]) -> None:
    if _ctl("status", cluster).returncode != 0:
        started = _ctl("start", cluster)
        assert started.returncode == 0, f"could not restart PostgreSQL: {started.stderr}"


@pytest.fixture
def cluster(postgres_server: str) -> Iterator[list[str]]:
    names = _cluster()
    try:
        yield names
    finally:
        _ensure_running(names)


def path(parent: str, nonce: str, max_children: int = 10**6) -> tuple[list[ChildEdge], LeafNonce]:
    return [ChildEdge(parent, nonce, max_children, RETAIN, 1)], LeafNonce(nonce, RETAIN, 1)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.exclusive
def test_server_restart_under_load_forgets_nothing_and_reconnects(
    cluster: list[str], pg_schemas: PostgresSchemas
) -> None:
    store = open_store(pg_schemas.url(pg_schemas.new(), connect_timeout=2))
    try:
        before = [f"before-{i}" for i in range(40)]
        for nonce in before:
            assert store.admit(*path("P", nonce), consume=True, now_ms=0) is None
        for i in range(3):
            assert store.admit(*path("limited", f"limited-{i}", 3), consume=True, now_ms=0) is None

        outcomes: dict[str, list[str]] = {}
        violations: list[str] = []
        lock = threading.Lock()
        warmed = threading.Semaphore(0)
        restarted = threading.Event()
        down = threading.Event()
        saw_outage = threading.Event()
        recovered = [threading.Event() for _ in range(LOAD_THREADS)]
        stop = threading.Event()

        def load(tid: int) -> None:
            accepts_after_restart = 0
            k = 0
            while not stop.is_set():
                k += 1
                nonce = f"load-{tid}-{k}"
                try:
                    result = store.admit(*path("P", nonce), consume=True, now_ms=0)
                    outcome = "accept" if result is None else result.reason.value
                except StateUnavailable:
                    outcome = "unavailable"
                    if down.is_set():
                        saw_outage.set()
                with lock:
                    outcomes.setdefault(nonce, []).append(outcome)
                if k % 4 == 0:  # a nonce consumed before the load must never be accepted again
                    old = before[(tid * 7 + k) % len(before)]
                    try:
                        again = store.admit(*path("P", old), consume=True, now_ms=0)
                        if again is None:
                            violations.append(f"{old} accepted twice")
                    except StateUnavailable:
                        pass
                if k == 10:
                    warmed.release()
                if restarted.is_set() and outcome == "accept":
                    accepts_after_restart += 1
                    if accepts_after_restart >= 3:
                        recovered[tid].set()
                        return

        threads = [threading.Thread(target=load, args=(t,), daemon=True) for t in range(LOAD_THREADS)]
        for thread in threads:
            thread.start()
        for _ in threads:
            assert warmed.acquire(timeout=60), "load did not start"

        try:
            stopped = _ctl("stop", cluster)
            assert stopped.returncode == 0, stopped.stderr
            down.set()
            started_at = time.monotonic()
            with pytest.raises(StateUnavailable):
                store.admit(*path("P", "probe-while-down"), consume=True, now_ms=0)
            assert time.monotonic() - started_at < 10, "an admit during the outage must fail within the timeout"
            assert saw_outage.wait(timeout=30), "the load saw no StateUnavailable while the server was down"
        finally:
            down.clear()
            started = _ctl("start", cluster)
            assert started.returncode == 0, started.stderr
        restarted.set()
        for event in recovered:
            assert event.wait(timeout=60), "the store did not reconnect by itself after the restart"
        stop.set()
        for thread in threads:
            thread.join(timeout=30)

        assert not violations, violations
        accepted = [n for n, seen in outcomes.items() if "accept" in seen]
        unknown = [n for n, seen in outcomes.items() if seen == ["unavailable"]]
        assert all(seen in (["accept"], ["unavailable"]) for seen in outcomes.values()), outcomes
        assert unknown, "expected some admits to fail during the outage"
        # Nothing consumed is forgotten: every accepted nonce (before or during the load) is a replay now.
        for nonce in before + accepted:
            assert store.admit(*path("P", nonce), consume=True, now_ms=0) == _replayed(), nonce
        # An admit that failed with StateUnavailable may or may not have committed; either way the
        # nonce is accepted at most once from here on.
        for nonce in unknown:
            first = store.admit(*path("P", nonce), consume=True, now_ms=0)
            assert first in (None, _replayed())
            assert store.admit(*path("P", nonce), consume=True, now_ms=0) == _replayed()
        # The per-parent child set survived too.
        limited = store.admit(*path("limited", "limited-late", 3), consume=True, now_ms=0)
        assert limited is not None and limited.reason is Reason.FANOUT_EXCEEDED
    finally:
        store.close()


def _replayed() -> object:
    from countersign.state import StateRejection

    return StateRejection(Reason.NONCE_REPLAYED, 1)
