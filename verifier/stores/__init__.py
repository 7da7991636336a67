"""Durable verifier state backends, chosen by URL.

``memory:`` (process-local, for tests), ``sqlite:///path/to/file.db`` (embedded default), and the
backends shared by verifier replicas: ``postgresql://user@host:5432/db?schema=countersign`` (needs the
``postgres`` extra) and ``dynamodb://TABLE?region=REGION`` (needs the ``aws`` extra). Each backend
module is imported only when its scheme is used, so this package imports without the optional extras.

A backend keeps replay state (:class:`countersign.state.ReplayState`), the verdict log
(:class:`countersign.state.VerdictLog`), or both (every backend here keeps both). The verifier takes its
replay state from ``store_url`` and its verdict log from ``verdict_log_url``, or from ``store_url``'s
backend when that is empty (:func:`open_verifier_stores`). See docs/stores.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

from countersign._daemon.sqlite import sqlite_file
from countersign.errors import CountersignError
from countersign.plugins import Plugin, open_plugin
from countersign.state import InMemoryState, InMemoryVerdictLog, ReplayState, VerdictLog, VerifierStore

StoreBackend = ReplayState | VerdictLog
"""What a store URL opens: a backend keeping replay state, the verdict log, or both."""


class StoreConfigError(CountersignError, ValueError):
    """A store URL that names no usable backend, or a backend that does not keep what it is named for."""


def _memory(url: str) -> StoreBackend:
    return InMemoryState()


def _sqlite(url: str) -> StoreBackend:
    from verifier.stores.sqlite import SqliteState

    path = sqlite_file(url)
    if path is None:
        raise StoreConfigError(
            f"SQLite URL must look like sqlite:///relative/state.db or sqlite:////absolute/state.db, got {url!r}"
        )
    return SqliteState(path)


def _postgresql(url: str) -> StoreBackend:
    from verifier.stores.postgres import PostgresState

    return PostgresState(url)


def _dynamodb(url: str) -> StoreBackend:
    from verifier.stores.dynamodb import DynamoDbState

    return DynamoDbState(url)


_POSTGRESQL = Plugin(_postgresql, "postgresql://user@host/db?schema=NAME", "replicas across hosts", "postgres")
# The verifier's stores by URL scheme (countersign.plugins: the command line's help and hints read it).
# Each keeps replay state, the verdict log or both (every one here: both).
STORE_FOR_SCHEME: Final[Mapping[str, Plugin[Callable[[str], StoreBackend]]]] = {
    "sqlite": Plugin(_sqlite, "sqlite:///path/verifier.db", "one host; sqlite:////path for an absolute path"),
    "memory": Plugin(_memory, "memory:", "this process only: forgotten when it ends"),
    "postgresql": _POSTGRESQL,
    "postgres": _POSTGRESQL,
    "dynamodb": Plugin(_dynamodb, "dynamodb://TABLE?region=R", "replicas across zones", "aws"),
}


def open_backend(url: str) -> StoreBackend:
    """Open the backend a URL names, whatever it keeps. Raises StoreConfigError for an unknown or
    malformed URL or a missing extra, and :class:`countersign.errors.StateUnavailable` when the store
    cannot be reached."""
    return open_plugin(STORE_FOR_SCHEME, urlsplit(url).scheme, url, kind="store URL scheme", error=StoreConfigError)


def _refused(url: str, what: str) -> StoreConfigError:
    return StoreConfigError(f"the {urlsplit(url).scheme} store keeps no {what}")


def _opened_as(url: str, role: type, what: str) -> StoreBackend:
    backend = open_backend(url)
    if not isinstance(backend, role):
        backend.close()
        raise _refused(url, what)
    return backend


def open_replay_state(url: str) -> ReplayState:
    """:func:`open_backend`, for its replay state (StoreConfigError if it keeps none)."""
    backend = _opened_as(url, ReplayState, "replay state")
    assert isinstance(backend, ReplayState)
    return backend


def open_verdict_log(url: str) -> VerdictLog:
    """:func:`open_backend`, for its verdict log (StoreConfigError if it keeps none)."""
    backend = _opened_as(url, VerdictLog, "verdict log")
    assert isinstance(backend, VerdictLog)
    return backend


def open_store(url: str) -> VerifierStore:
    """:func:`open_backend`, for a backend keeping both (every built-in one); StoreConfigError otherwise."""
    backend = _opened_as(url, VerifierStore, "replay state and verdict log together")
    assert isinstance(backend, VerifierStore)
    return backend


@dataclass(frozen=True, slots=True)
class VerifierStores:
    """What a verifier keeps its state in: the replay state and the verdict log, one backend or two."""

    replay: ReplayState
    verdict_log: VerdictLog

    def backends(self) -> list[StoreBackend]:
        """Each backend once (one object when a single backend keeps both)."""
        held: list[StoreBackend] = [self.replay]
        if all(backend is not self.verdict_log for backend in held):
            held.append(self.verdict_log)
        return held

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        """Forget expired entries and verdicts: ``collect_expired`` once on each backend, each up to
        ``limit``; the most any one backend removed (the caller repeats while that reaches ``limit``)."""
        return max(backend.collect_expired(now_ms, limit) for backend in self.backends())

    def close(self) -> None:
        for backend in self.backends():
            backend.close()


def open_verifier_stores(store_url: str, verdict_log_url: str = "", *, recording: bool = True) -> VerifierStores:
    """The replay state from ``store_url``'s backend; the verdict log from ``verdict_log_url``'s, or
    (empty, or the same URL) from ``store_url``'s (opened once). Raises StoreConfigError when a backend
    does not keep what it is named for. Only when ``recording`` is off may there be no verdict log at
    all: then an empty in-memory one (nothing is recorded in it) answers ``Impact``."""
    backend = open_backend(store_url)
    try:
        if not isinstance(backend, ReplayState):
            raise _refused(store_url, "replay state: store_url names the store that does")
        if verdict_log_url and verdict_log_url != store_url:
            return VerifierStores(backend, open_verdict_log(verdict_log_url))
        if isinstance(backend, VerdictLog):
            return VerifierStores(backend, backend)
        if recording:
            raise StoreConfigError(
                f"the {urlsplit(store_url).scheme} store keeps no verdict log: name one in verdict_log_url,"
                " or set verdict_log = false"
            )
        return VerifierStores(backend, InMemoryVerdictLog())
    except BaseException:
        backend.close()
        raise
