"""Durable verifier state backends, chosen by URL.

``memory:`` (process-local, for tests), ``sqlite:///path/to/file.db`` (embedded default), and the
backends shared by verifier replicas: ``postgresql://user@host:5432/db?schema=countersign`` (needs the
``postgres`` extra) and ``dynamodb://TABLE?region=REGION`` (needs the ``aws`` extra). Each backend
module is imported only when its scheme is used, so this package imports without the optional extras.
See docs/stores.md.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final
from urllib.parse import urlsplit

from countersign._daemon.sqlite import sqlite_file
from countersign.errors import CountersignError
from countersign.plugins import Plugin, open_plugin
from countersign.state import InMemoryState, VerifierStore


class StoreConfigError(CountersignError, ValueError):
    """A store URL that names no usable backend."""


def _memory(url: str) -> VerifierStore:
    return InMemoryState()


def _sqlite(url: str) -> VerifierStore:
    from verifier.stores.sqlite import SqliteState

    path = sqlite_file(url)
    if path is None:
        raise StoreConfigError(
            f"SQLite URL must look like sqlite:///relative/state.db or sqlite:////absolute/state.db, got {url!r}"
        )
    return SqliteState(path)


def _postgresql(url: str) -> VerifierStore:
    from verifier.stores.postgres import PostgresState

    return PostgresState(url)


def _dynamodb(url: str) -> VerifierStore:
    from verifier.stores.dynamodb import DynamoDbState

    return DynamoDbState(url)


_POSTGRESQL = Plugin(_postgresql, "postgresql://user@host/db?schema=NAME", "replicas across hosts", "postgres")
# The verifier's stores by URL scheme (countersign.plugins: the command line's help and hints read it).
STORE_FOR_SCHEME: Final[Mapping[str, Plugin[Callable[[str], VerifierStore]]]] = {
    "sqlite": Plugin(_sqlite, "sqlite:///path/verifier.db", "one host; sqlite:////path for an absolute path"),
    "memory": Plugin(_memory, "memory:", "this process only: forgotten when it ends"),
    "postgresql": _POSTGRESQL,
    "postgres": _POSTGRESQL,
    "dynamodb": Plugin(_dynamodb, "dynamodb://TABLE?region=R", "replicas across zones", "aws"),
}


def open_store(url: str) -> VerifierStore:
    """Open the verifier state a URL names. Raises StoreConfigError for an unknown or malformed URL or
    a missing extra, and :class:`countersign.errors.StateUnavailable` when the store cannot be reached."""
    return open_plugin(STORE_FOR_SCHEME, urlsplit(url).scheme, url, kind="store URL scheme", error=StoreConfigError)
