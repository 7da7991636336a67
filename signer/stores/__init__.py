"""The signer's durable state backends, chosen by URL (docs/stores.md "Signer state", ADR 0033).

``memory:`` (process-local, for tests), ``sqlite:///path/signer.db`` (the default; replicas on one host
may share the file), and the stores replicas share across hosts: ``postgresql://…?schema=NAME`` (the
``postgres`` extra) and ``dynamodb://TABLE?region=REGION`` (the ``aws`` extra). Each backend module is
imported only when its scheme is used, so this package imports without the optional extras.

Every backend answers the same contract (:mod:`countersign.signer_state`): :meth:`SignerStateStore.read`
a view, :meth:`SignerStateStore.apply` conditional writes, each whole or not at all, with the meaning of
:class:`countersign.signer_state.SignerStateModel`; an unreachable store raises
:class:`countersign.errors.StateUnavailable`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final, Protocol
from urllib.parse import urlsplit

from countersign.errors import ConfigError
from countersign.plugins import Plugin, open_plugin
from countersign.signer_state import StateReads, StateView, StateWrite


class SignerStateStore(Protocol):
    """Where a deployer's signer replicas keep their state."""

    @property
    def batches(self) -> bool:
        """Whether :meth:`apply` of several writes shares one durable commit (then the signer groups
        concurrent calls' writes: ADR 0032's group commit); else each write is its own commit."""
        ...

    def read(self, reads: StateReads) -> StateView:
        """What ``reads`` names, as stored now (strongly consistent)."""
        ...

    def apply(self, writes: Sequence[StateWrite]) -> list[bool]:
        """Apply each write in order, each whole if its conditions hold (True) or not at all (False),
        and make them durable before returning. Raises StateUnavailable (then nothing is known to be
        written: a retry reads again)."""
        ...

    def collect_expired(self, cutoff_ms: int, limit: int) -> dict[str, int]:
        """Forget at most ``limit`` expired rows per table (expired before ``cutoff_ms``); rows per table."""
        ...

    def row_counts(self) -> dict[str, int] | None:
        """Rows held per table, or None where counting would cost a scan of the store (DynamoDB)."""
        ...

    def close(self) -> None: ...


def _memory(url: str) -> SignerStateStore:
    from signer.stores.memory import MemoryState

    return MemoryState()


def _sqlite(url: str) -> SignerStateStore:
    from countersign._daemon.sqlite import sqlite_file
    from signer.stores.sqlite import SqliteState

    path = sqlite_file(url)
    if path is None:
        raise ConfigError(
            f"state_url must look like sqlite:///relative/signer.db or sqlite:////absolute/signer.db, got {url!r}"
        )
    return SqliteState(path)


def _postgresql(url: str) -> SignerStateStore:
    from signer.stores.postgres import PostgresState

    return PostgresState(url)


def _dynamodb(url: str) -> SignerStateStore:
    from signer.stores.dynamodb import DynamoDbState

    return DynamoDbState(url)


_POSTGRESQL = Plugin(_postgresql, "postgresql://user@host/db?schema=NAME", "replicas across hosts", "postgres")
# The signer's state stores by URL scheme (countersign.plugins: the command line's help and hints read it).
STATE_FOR_SCHEME: Final[Mapping[str, Plugin[Callable[[str], SignerStateStore]]]] = {
    "sqlite": Plugin(_sqlite, "sqlite:///path/signer.db", "replicas on one host share the file"),
    "memory": Plugin(_memory, "memory:", "this process only: forgotten when it ends"),
    "postgresql": _POSTGRESQL,
    "postgres": _POSTGRESQL,
    "dynamodb": Plugin(_dynamodb, "dynamodb://TABLE?region=R", "replicas across zones", "aws"),
}


def open_signer_state(url: str) -> SignerStateStore:
    """Open the signer state a URL names. Raises ConfigError for an unknown or malformed URL or a
    missing extra, and StateUnavailable when the store cannot be reached."""
    return open_plugin(STATE_FOR_SCHEME, urlsplit(url).scheme, url, kind="state_url scheme", error=ConfigError)
