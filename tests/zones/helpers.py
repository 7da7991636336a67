"""Helpers of the zone scenarios: polling, typed errors, the signers' SQLite state, the shared
PostgreSQL store. Nothing here sleeps to synchronise: ``poll`` retries a check until a deadline."""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable, Iterable
from contextlib import closing
from typing import Any, TypeVar

import psycopg
from psycopg import sql

from countersign.client import VerifierClient
from countersign.errors import ServiceError
from countersign.reasons import VerificationResult
from tools.zones.evidence import Evidence
from tools.zones.mesh import ZoneMesh
from tools.zones.net import PREFIX, ZoneNetwork

T = TypeVar("T")


def poll(check: Callable[[], T | None], *, timeout_s: float = 10.0, interval_s: float = 0.05, what: str = "") -> T:
    """Call ``check`` until it returns something truthy; fail with the last value at the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what or check}; last value {last!r}")
        time.sleep(interval_s)


def service_error(call: Callable[[], object]) -> ServiceError:
    """Run ``call`` and return the typed error it must raise."""
    try:
        result = call()
    except ServiceError as exc:
        return exc
    raise AssertionError(f"expected an error, got {result!r}")


def verdict(
    client: VerifierClient, item: Evidence, *, audit: bool = False, patience_s: float = 15.0
) -> VerificationResult:
    """The verifier's verdict. A store outage (``STATE_UNAVAILABLE``: other suites on a shared machine
    restart PostgreSQL) is no verdict: ask the same verifier again until ``patience_s``."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            return client.verify(item.data, item.output, audit=audit, timeout_s=5).result
        except ServiceError as exc:
            if exc.code != "STATE_UNAVAILABLE" or time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def code_of(result: VerificationResult) -> str:
    return "ACCEPT" if result else str(result.reason)


# --- the signers' durable state ----------------------------------------------------------------


def _query(zoned: ZoneMesh, deployer: str, statement: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
    # Read-only, through SQLite's own locking (WAL): safe while the daemon writes.
    uri = f"file:{zoned.local.workdir / 'state' / f'{deployer}-signer.db'}?mode=ro"
    with closing(sqlite3.connect(uri, uri=True, timeout=5)) as db:
        return db.execute(statement, args).fetchall()


def issued_count(zoned: ZoneMesh, deployer: str) -> int:
    return int(_query(zoned, deployer, "SELECT COUNT(*) FROM issued")[0][0])


def children_count(zoned: ZoneMesh, deployer: str, parent_digest: str) -> int:
    return int(_query(zoned, deployer, "SELECT COUNT(*) FROM children WHERE parent = ?", (parent_digest,))[0][0])


def grant_used(zoned: ZoneMesh, deployer: str, grant_id: str) -> bool:
    rows = _query(zoned, deployer, "SELECT manifest_digest FROM grants WHERE grant_id = ?", (grant_id,))
    assert rows, f"grant {grant_id} is not in {deployer}'s state"
    return rows[0][0] is not None


# --- the shared PostgreSQL store ---------------------------------------------------------------


def consumed(zoned: ZoneMesh, keys: Iterable[str]) -> set[str]:
    """Which of these replay keys the shared store holds as consumed."""
    wanted = list(keys)
    with psycopg.connect(zoned.postgres_url, connect_timeout=5, autocommit=True) as conn:
        rows = conn.execute(
            sql.SQL("SELECT nonce FROM {}.consumed_nonces WHERE nonce = ANY(%s)").format(sql.Identifier(zoned.schema)),
            (wanted,),
        ).fetchall()
    return {row[0] for row in rows}


# --- teardown ---------------------------------------------------------------------------------


def leftovers_of(network: ZoneNetwork) -> list[str]:
    """Namespaces, links and the state directory of ``network`` that still exist."""
    ip = shutil.which("ip") or "ip"
    namespaces = subprocess.run([ip, "netns", "list"], capture_output=True, text=True, check=False).stdout
    links = subprocess.run([ip, "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    prefix = f"{PREFIX}-{network.run_id}"
    found = [f"netns {line.split()[0]}" for line in namespaces.splitlines() if line.startswith(prefix)]
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if prefix in line]
    if network.state_dir.exists():
        found.append(f"state {network.state_dir}")
    return found
