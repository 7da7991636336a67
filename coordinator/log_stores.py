"""The registry log's stores by URL scheme (countersign.plugins; docs/stores.md "Registry log").

``sqlite:///path`` (the default; coordinators on one host may share the file), ``postgresql://…`` and
``dynamodb://TABLE?region=…`` (coordinator replicas in several zones share one log). Each backend's
module is imported only when its scheme is used, so this module imports without the extras.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Final
from urllib.parse import urlsplit

from coordinator.store import LogStore, SqliteLogStore
from countersign._daemon.sqlite import sqlite_file
from countersign.errors import ConfigError
from countersign.plugins import Plugin, open_plugin


def _sqlite(url: str) -> LogStore:
    path = sqlite_file(url)
    if path is None:
        shapes = "sqlite:///relative/registry.db or sqlite:////absolute/registry.db"
        raise ConfigError(f"log_store must look like {shapes}, got {url!r}")
    return SqliteLogStore(path)


def _postgresql(url: str) -> LogStore:
    from coordinator.postgres_store import PostgresLogStore

    return PostgresLogStore(url)


def _dynamodb(url: str) -> LogStore:
    from coordinator.dynamodb_store import DynamoDbLogStore

    return DynamoDbLogStore(url)


_POSTGRESQL = Plugin(_postgresql, "postgresql://user@host/db?schema=NAME", "replicas across hosts", "postgres")
# The registry log's stores by URL scheme (countersign.plugins: the command line's help and hints read it).
LOG_STORE_FOR_SCHEME: Final[Mapping[str, Plugin[Callable[[str], LogStore]]]] = {
    "sqlite": Plugin(_sqlite, "sqlite:///path/registry.db", "coordinators on one host share the file"),
    "postgresql": _POSTGRESQL,
    "postgres": _POSTGRESQL,
    "dynamodb": Plugin(_dynamodb, "dynamodb://TABLE?region=R", "replicas across zones", "aws"),
}


def open_log_store(url: str) -> LogStore:
    """Open the registry log a URL names. Raises ConfigError for an unknown or malformed URL or a
    missing extra."""
    return open_plugin(LOG_STORE_FOR_SCHEME, urlsplit(url).scheme, url, kind="log_store scheme", error=ConfigError)
