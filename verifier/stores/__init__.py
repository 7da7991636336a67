"""Durable verifier state backends, chosen by URL.

``memory:`` (process-local, for tests), ``sqlite:///path/to/file.db`` (embedded default), and the
backends shared by verifier replicas: ``postgresql://user@host:5432/db?schema=countersign`` (needs the
``postgres`` extra) and ``dynamodb://TABLE?region=REGION`` (needs the ``aws`` extra). Each backend
module is imported only when its scheme is used, so this package imports without the optional extras.
See docs/stores.md.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

from countersign._daemon.sqlite import sqlite_file
from countersign.errors import CountersignError
from countersign.state import InMemoryState, VerifierStore


class StoreConfigError(CountersignError, ValueError):
    """A store URL that names no usable backend."""


def _sqlite(url: str) -> VerifierStore:
    from verifier.stores.sqlite import SqliteState

    path = sqlite_file(url)
    if path is None:
        raise StoreConfigError(
            f"SQLite URL must look like sqlite:///relative/state.db or sqlite:////absolute/state.db, got {url!r}"
        )
    return SqliteState(path)


def _memory(url: str) -> VerifierStore:
    return InMemoryState()


def _postgresql(url: str) -> VerifierStore:
    try:
        from verifier.stores.postgres import PostgresState
    except ImportError as exc:
        raise StoreConfigError(f"{url.split(':', 1)[0]} store needs the 'postgres' extra (psycopg): {exc}") from exc
    return PostgresState(url)


def _dynamodb(url: str) -> VerifierStore:
    try:
        from verifier.stores.dynamodb import DynamoDbState
    except ImportError as exc:
        raise StoreConfigError(f"dynamodb store needs the 'aws' extra (boto3): {exc}") from exc
    return DynamoDbState(url)


STORE_FOR_SCHEME: dict[str, Callable[[str], VerifierStore]] = {
    "sqlite": _sqlite,
    "memory": _memory,
    "postgresql": _postgresql,
    "postgres": _postgresql,
    "dynamodb": _dynamodb,
}


def open_store(url: str) -> VerifierStore:
    """Open the verifier state a URL names. Raises StoreConfigError for an unknown or malformed URL,
    and :class:`countersign.errors.StateUnavailable` when the store cannot be reached."""
    scheme = urlsplit(url).scheme
    factory = STORE_FOR_SCHEME.get(scheme)
    if factory is None:
        raise StoreConfigError(f"unknown store URL scheme {scheme!r} in {url!r}; known: {sorted(STORE_FOR_SCHEME)}")
    return factory(url)
