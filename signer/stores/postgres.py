"""``postgresql://…``: the signer's state in one PostgreSQL schema, shared by a deployer's signer replicas.

URL parameters as every daemon store reads them (:mod:`countersign._daemon.postgres`); the schema
defaults to ``countersign_signer``, the password to ``COUNTERSIGN_SIGNER_STATE_PASSWORD``. Migrations are
the ``.sql`` files of ``signer/stores/migrations/postgres``, applied in order under an advisory lock by
whichever replica starts first.

A read is one call of ``signer_read`` (one round trip, one snapshot); a batch of writes is one call of
``signer_apply`` (one transaction, one commit): each write in its own subtransaction, each of its
conditions a single statement on the row it guards, so concurrent replicas queue on that row and the
later one finds its condition gone (a conflict, rolled back whole).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import Any

from psycopg import sql

from countersign._daemon.postgres import PostgresDatabase, load_migrations, parse_postgres_url
from countersign.records import StreamUnit
from countersign.signer_state import (
    COLLECTED_TABLES,
    Proposal,
    RequestRecord,
    SessionState,
    StateReads,
    StateView,
    StateWrite,
    StoredGrant,
)

DEFAULT_SCHEMA = "countersign_signer"
PASSWORD_ENV = "COUNTERSIGN_SIGNER_STATE_PASSWORD"  # noqa: S105 - the NAME of the variable, not a password
VERSION_TABLE = "countersign_signer_version"
MIGRATIONS = "signer.stores.migrations.postgres"


class PostgresState:
    batches = True

    def __init__(self, url: str) -> None:
        settings = parse_postgres_url(
            url, default_schema=DEFAULT_SCHEMA, password_env=PASSWORD_ENV, application="countersign-signer"
        )
        self.schema = settings.schema
        self._db = PostgresDatabase(settings, name="signer")
        try:
            self._db.migrate(load_migrations(MIGRATIONS), table=VERSION_TABLE)
        except BaseException:
            self._db.close()
            raise
        ident = sql.Identifier(self.schema)
        self._read_sql = sql.SQL("SELECT * FROM {}.signer_read(%s, %s, %s, %s, %s, %s, %s)").format(ident)
        self._apply_sql = sql.SQL("SELECT {}.signer_apply(%s::jsonb)").format(ident)
        self._collect_sql = sql.SQL("SELECT tbl, removed FROM {}.signer_collect(%s, %s)").format(ident)
        self._count_sql = sql.SQL(" UNION ALL ").join(
            sql.SQL("SELECT {}, count(*) FROM {}.{}").format(sql.Literal(t), ident, sql.Identifier(t))
            for t in COLLECTED_TABLES
        )

    def read(self, reads: StateReads) -> StateView:
        agent, session = reads.session or (None, None)
        keys = (reads.issued, reads.children_of, agent, session, reads.grant, reads.proposal, reads.request)
        with self._db.connection("read") as conn:
            row = conn.execute(self._read_sql, keys).fetchone()
        assert row is not None  # the function answers one row, whatever is stored
        return _view(reads, row)

    def apply(self, writes: Sequence[StateWrite]) -> list[bool]:
        body = json.dumps([_write_json(w) for w in writes])
        row = self._db.run("apply", lambda conn: conn.execute(self._apply_sql, (body,)).fetchone())
        return [bool(applied) for applied in row[0]]

    def collect_expired(self, cutoff_ms: int, limit: int) -> dict[str, int]:
        rows = self._db.run("collect", lambda conn: conn.execute(self._collect_sql, (cutoff_ms, limit)).fetchall())
        removed = {str(table): int(count) for table, count in rows}
        return {table: removed.get(table, 0) for table in COLLECTED_TABLES}

    def row_counts(self) -> dict[str, int] | None:
        with self._db.connection("count") as conn:
            return {str(table): int(count) for table, count in conn.execute(self._count_sql).fetchall()}

    def close(self) -> None:
        self._db.close()


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _write_json(write: StateWrite) -> dict[str, Any]:
    """A write as ``signer_apply_one`` reads it (byte strings in base64)."""
    body: dict[str, Any] = {
        "issued": [{"digest": r.digest, "path": _b64(r.path), "expires_ms": r.expires_ms} for r in write.issued]
    }
    if (child := write.child) is not None:
        body["child"] = {
            "parent": child.parent, "nonce": child.nonce, "max_children": child.max_children,
            "expires_ms": child.expires_ms,
        }  # fmt: skip
    if (update := write.session) is not None:
        state = update.state
        body["session"] = {
            "agent": state.agent, "session": state.session, "seq": state.last_seq, "last_digest": state.last_digest,
            "closed": state.closed, "stream_unit": None if state.stream is None else state.stream[0].value,
            "stream_n": None if state.stream is None else state.stream[1], "previous_seq": update.previous_seq,
            "expires_ms": update.expires_ms,
        }  # fmt: skip
    if (grant := write.new_grant) is not None:
        body["new_grant"] = {
            "grant_id": grant.grant_id, "parent": grant.parent, "child_deployer": grant.child_deployer,
            "expires_ms": grant.expires_ms,
        }  # fmt: skip
    if (spend := write.spend) is not None:
        body["spend"] = {
            "grant_id": spend.grant_id,
            "manifest_digest": spend.manifest_digest,
            "parent_cosig": spend.parent_cosig,
        }
    if (proposal := write.proposal) is not None:
        body["proposal"] = {
            "grant_id": proposal.grant_id, "parent": proposal.parent, "child_record": _b64(proposal.child_record),
            "child_cosig": proposal.child_cosig, "expires_ms": proposal.expires_ms,
        }  # fmt: skip
    if (seal := write.seal) is not None:
        body["seal"] = {"grant_id": seal.grant_id, "path": _b64(seal.path)}
    if (request := write.request) is not None:
        body["request"] = {
            "request_id": request.request_id, "fingerprint": request.fingerprint, "answer": _b64(request.answer),
            "expires_ms": request.expires_ms, "record": request.record,
        }  # fmt: skip
    return body


def _view(reads: StateReads, row: tuple[Any, ...]) -> StateView:
    (issued, child_count, s_seq, s_last, s_closed, s_unit, s_n, g_parent, g_child, g_expires, g_manifest, g_cosig,
     p_parent, p_record, p_cosig, p_expires, p_sealed, r_fingerprint, r_answer, r_expires, r_record) = row  # fmt: skip
    session = grant = proposal = request = None
    if reads.session is not None and s_seq is not None:
        stream = None if s_unit is None else (StreamUnit(s_unit), int(s_n))
        session = SessionState(reads.session[1], reads.session[0], int(s_seq), str(s_last), bool(s_closed), stream)
    if reads.grant is not None and g_parent is not None:
        grant = StoredGrant(reads.grant, str(g_parent), str(g_child), int(g_expires), g_manifest, g_cosig)
    if reads.proposal is not None and p_parent is not None:
        sealed = None if p_sealed is None else bytes(p_sealed)
        proposal = Proposal(reads.proposal, str(p_parent), bytes(p_record), str(p_cosig), int(p_expires), sealed)
    if reads.request is not None and r_fingerprint is not None:
        request = RequestRecord(reads.request, str(r_fingerprint), bytes(r_answer), int(r_expires), str(r_record))
    return StateView(
        issued=None if issued is None else bytes(issued),
        child_count=0 if child_count is None else int(child_count),
        session=session,
        grant=grant,
        proposal=proposal,
        request=request,
    )
