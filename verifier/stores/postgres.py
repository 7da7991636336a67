"""PostgreSQL verifier state: one database shared by any number of verifier replicas.

URL: ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME[?PARAMS]``, read by the one parser every daemon's
PostgreSQL store uses (:func:`countersign._daemon.postgres.parse_postgres_url`: ``schema``,
``connect_timeout``, ``statement_timeout_ms``, ``pool_min_size`` / ``pool_max_size``, every libpq
parameter passed through). Here the schema defaults to ``countersign`` and the password, when the URL
has none, comes from ``COUNTERSIGN_STORE_PASSWORD`` (then libpq's own ``PGPASSWORD`` / ``.pgpass``).

Migrations are the plain ``.sql`` files of ``verifier/stores/migrations/postgres`` (``V<n>__<name>.sql``),
applied in order by :meth:`countersign._daemon.postgres.PostgresDatabase.migrate` under an advisory
lock, the version kept in ``countersign_schema_version`` as every earlier release kept it: a schema at
version N, whichever release made it, is migrated on from N.

Atomicity: the whole of :meth:`PostgresState.admit` is ONE statement, ``SELECT countersign_admit(...)``,
run in autocommit, so one round trip and one transaction. The function, installed by the migrations,
first locks the counter row of every parent on the path (creating missing rows) in sorted order
(``INSERT ... ON CONFLICT DO UPDATE``), so two admits sharing parents serialise per parent and cannot
deadlock; it then checks each edge against the locked counters, records new children (incrementing
the counter only when the child row is really new) and finally consumes the leaf nonce with
``INSERT ... ON CONFLICT DO NOTHING``: exactly one of any number of concurrent consumers inserts.

The verdict log (schema version 7, issue 29): what repeats stored once per client identity,
``verdict_log``, ``verdict_paths`` and ``verdict_path_uses`` (verifier/stores/verdict_rows.py); a
verdict is recorded by one statement (a data-modifying CTE), so all of it or nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

from countersign._daemon.postgres import (
    RETRYABLE_SQLSTATES,
    PostgresDatabase,
    PostgresSettings,
    load_migrations,
    parse_postgres_url,
)
from countersign.errors import ConfigError, StateUnavailable
from countersign.reasons import Reason
from countersign.state import (
    MAX_LOOKUP_VERDICTS,
    MAX_SESSION_LEAVES,
    ChildEdge,
    ClientUsage,
    DependencyKind,
    EarlierAcceptance,
    LeafNonce,
    StateRejection,
    VerdictEntry,
    bounded_cause,
    check_session_leaves,
    records_from_json,
    trim_by_share,
)
from verifier.stores import StoreConfigError
from verifier.stores.verdict_rows import (
    LEGACY_SIGNATURE_COLUMNS,
    LEGACY_VERDICT_COLUMNS,
    PATH_COLUMNS,
    VERDICT_COLUMNS,
    VERDICT_FIELDS,
    PathReader,
    entry_from_row,
    kind_code,
    legacy_entries,
    marked_row,
    path_row,
    use_rows,
    verdict_row,
)

DEFAULT_SCHEMA = "countersign"
PASSWORD_ENV = "COUNTERSIGN_STORE_PASSWORD"  # noqa: S105 - the NAME of the variable, not a password
VERSION_TABLE = "countersign_schema_version"
MIGRATIONS = "verifier.stores.migrations.postgres"
SCHEMA_VERSION = 7  # the last file of MIGRATIONS (a test holds the two together)

# Deadlocks cannot arise between admits (parents are locked in one order), but a retry on these codes
# costs nothing: the statement's transaction was rolled back as a whole, so nothing was recorded.
_ADMIT_ATTEMPTS = 3

# Result codes of countersign_admit: >= 0 is the position (in the edge list) of a fan-out rejection.
_ACCEPTED = -1
_REPLAYED = -2
_RETRY = -3  # consumed before under the same request id: the second column is when


def store_settings(url: str) -> PostgresSettings:
    """The verifier store's reading of ``url`` (its schema and password defaults). Raises StoreConfigError."""
    try:
        return parse_postgres_url(
            url, default_schema=DEFAULT_SCHEMA, password_env=PASSWORD_ENV, application="countersign-verifier"
        )
    except ConfigError as exc:
        raise StoreConfigError(str(exc)) from None


def parse_url(url: str) -> tuple[str, str, dict[str, int]]:
    """:func:`store_settings` as (libpq conninfo, schema, store settings), for the callers that open
    their own connection to the verifier's store (``countersign impact``, the zones harness)."""
    found = store_settings(url)
    return (
        found.conninfo,
        found.schema,
        {
            "connect_timeout": found.connect_timeout,
            "statement_timeout_ms": found.statement_timeout_ms,
            "pool_min_size": found.pool_min_size,
            "pool_max_size": found.pool_max_size,
        },
    )


def migration_lock(schema: str) -> str:
    """The advisory lock migrations of ``schema`` are applied under: the name every release used, so
    replicas of an earlier release starting beside this one queue on the same lock."""
    return f"countersign-schema:{schema}"


class PostgresState:
    """:class:`countersign.state.VerifierStore` (replay state and verdict log) in a PostgreSQL schema
    shared by verifier replicas."""

    def __init__(self, url: str) -> None:
        settings = store_settings(url)
        self.schema = settings.schema
        self._db = PostgresDatabase(settings, name="verifier")
        self._connection = self._db.connection
        ident = sql.Identifier(self.schema)
        self._admit_sql = sql.SQL(
            "SELECT code, accepted FROM {}.countersign_admit("
            "%s::text[], %s::text[], %s::integer[], %s::bigint[], %s, %s::bigint, %s, %s::text, %s::bigint)"
        ).format(ident)
        self._admit_session_sql = sql.SQL(
            "SELECT code, accepted FROM {}.countersign_admit_session("
            "%s::text[], %s::text[], %s::integer[], %s::bigint[], %s::text[], %s::bigint[], %s, %s::text, %s::bigint)"
        ).format(ident)
        self._collect_sql = sql.SQL("SELECT {}.countersign_collect(%s::bigint, %s::integer)").format(ident)
        self._count_sql = sql.SQL(
            "SELECT (SELECT count(*) FROM {s}.consumed_nonces) + (SELECT count(*) FROM {s}.children)"
        ).format(s=ident)
        # A verdict in one statement: its path if the client's store lacks it (locking the path row
        # if it is there, so a collector cannot take the path from under it), the path's index
        # entries if the path is new, and the verdict row.
        self._record_sql = sql.SQL(
            "WITH p AS (INSERT INTO {s}.verdict_paths AS old ({pc}) SELECT %s, %s, %s, %s, %s WHERE %s"
            " ON CONFLICT (client, path_digest) DO UPDATE SET bytes = old.bytes WHERE false"
            " RETURNING client, path_digest),"
            " u AS (INSERT INTO {s}.verdict_path_uses (kind, value, client, path_digest)"
            " SELECT x.kind, x.value, p.client, p.path_digest FROM p, unnest(%s::text[], %s::text[]) AS x(kind, value)"
            " ON CONFLICT DO NOTHING)"
            " INSERT INTO {s}.verdict_log ({vc}) VALUES ({vp})"
        ).format(
            s=ident, pc=sql.SQL(PATH_COLUMNS), vc=sql.SQL(VERDICT_COLUMNS),
            vp=sql.SQL(", ".join(["%s"] * VERDICT_FIELDS)),
        )  # fmt: skip
        select_entry = sql.SQL(
            "SELECT {vc}, p.construction, p.records FROM {s}.verdict_log AS v LEFT JOIN {s}.verdict_paths AS p"
            " ON p.client = v.client AND p.path_digest = v.path_digest"
        ).format(s=ident, vc=sql.SQL(", ".join("v." + c.strip() for c in VERDICT_COLUMNS.split(","))))
        self._lookup_sql = {
            mine: sql.SQL(
                "{select} WHERE v.verdict = 'ACCEPT' AND v.time_ms >= %s AND (v.client, v.path_digest) IN ("
                " SELECT client, path_digest FROM {s}.verdict_path_uses WHERE kind = %s AND value = ANY(%s::text[])"
                "{mine}) ORDER BY v.time_ms, v.verdict_id LIMIT %s"
            ).format(select=select_entry, s=ident, mine=sql.SQL(" AND client = %s" if mine else ""))
            for mine in (False, True)
        }
        self._mark_sql = sql.SQL(
            "UPDATE {s}.verdict_log SET needs_revalidation = true, revalidation_cause = %s, marked_ms = %s"
            " WHERE verdict_id = ANY(%s::text[]) AND NOT needs_revalidation"
        ).format(s=ident)
        self._expired_sql = sql.SQL(
            "DELETE FROM {s}.verdict_log WHERE verdict_id IN ("
            " SELECT verdict_id FROM {s}.verdict_log WHERE retain_until_ms < %s"
            " ORDER BY retain_until_ms LIMIT %s FOR UPDATE SKIP LOCKED) RETURNING client, path_digest, bytes"
        ).format(s=ident)
        self._oldest_sql = sql.SQL(
            "DELETE FROM {s}.verdict_log WHERE verdict_id IN ("
            " SELECT verdict_id FROM {s}.verdict_log WHERE client = %s ORDER BY time_ms, verdict_id LIMIT %s"
            " FOR UPDATE SKIP LOCKED) RETURNING client, path_digest, bytes"
        ).format(s=ident)
        self._lock_paths_sql = sql.SQL(
            "SELECT 1 FROM {s}.verdict_paths WHERE client = %s AND path_digest = ANY(%s::bytea[])"
            " ORDER BY path_digest FOR UPDATE"
        ).format(s=ident)
        self._orphans_sql = sql.SQL(
            "DELETE FROM {s}.verdict_paths AS p WHERE p.client = %s AND p.path_digest = ANY(%s::bytea[])"
            " AND NOT EXISTS (SELECT 1 FROM {s}.verdict_log AS v WHERE v.client = p.client"
            " AND v.path_digest = p.path_digest) RETURNING p.path_digest, p.records, p.bytes"
        ).format(s=ident)
        self._drop_uses_sql = sql.SQL(
            "DELETE FROM {s}.verdict_path_uses AS u USING unnest(%s::text[], %s::text[], %s::text[], %s::bytea[])"
            " AS x(kind, value, client, path_digest) WHERE u.kind = x.kind AND u.value = x.value"
            " AND u.client = x.client AND u.path_digest = x.path_digest"
        ).format(s=ident)
        self._usage_sql = sql.SQL(
            "SELECT client, sum(n)::bigint, sum(b)::bigint FROM ("
            " SELECT client, count(*) AS n, sum(bytes) AS b FROM {s}.verdict_log GROUP BY client"
            " UNION ALL SELECT client, 0, sum(bytes) FROM {s}.verdict_paths GROUP BY client) AS t GROUP BY client"
        ).format(s=ident)
        self._verdict_count_sql = sql.SQL("SELECT count(*) FROM {s}.verdict_log").format(s=ident)
        try:
            self.migrate()
        except BaseException:
            self._db.close()
            raise

    def migrate(self) -> int:
        """Bring the schema to :data:`SCHEMA_VERSION`; idempotent and safe to run concurrently (every
        file in its own transaction under the migration lock). Then, if the schema still holds the
        verdicts of versions 3-6, move them over (:meth:`_move_legacy_verdicts`). Returns the version
        found before. Raises StateUnavailable for a schema newer than this software."""
        try:
            found = self._db.migrate(load_migrations(MIGRATIONS), table=VERSION_TABLE, lock=migration_lock(self.schema))
        except ConfigError as exc:  # a schema newer than this software: roll verifiers forward, not back
            raise StateUnavailable(str(exc)) from None
        self._db.run("move legacy verdicts", self._move_legacy_verdicts)
        return found

    def schema_version(self) -> int:
        with self._connection("schema version") as conn:
            row = conn.execute(
                sql.SQL("SELECT coalesce(max(version), 0) FROM {}.countersign_schema_version").format(
                    sql.Identifier(self.schema)
                )
            ).fetchone()
        return int(row[0]) if row else 0

    def _call(self, what: str, query: sql.Composed, params: Sequence[Any]) -> tuple[Any, ...] | None:
        """Run one statement (one transaction, autocommit: no BEGIN and COMMIT round trips) and return
        its row. A deadlock or serialisation failure rolled it back whole, so it is retried; nothing else is."""
        for attempt in range(_ADMIT_ATTEMPTS):
            try:
                with self._connection(what) as conn:
                    return conn.execute(query, params).fetchone()
            except StateUnavailable as exc:
                cause = exc.__cause__
                retry = isinstance(cause, psycopg.Error) and cause.sqlstate in RETRYABLE_SQLSTATES
                if not retry or attempt + 1 == _ADMIT_ATTEMPTS:
                    raise
        raise AssertionError("unreachable")

    def admit(
        self, edges: Sequence[ChildEdge], leaf: LeafNonce, *, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        params = (
            [e.parent_digest for e in edges],
            [e.child_nonce for e in edges],
            [e.max_children for e in edges],
            [e.retain_until_ms for e in edges],
            leaf.nonce,
            leaf.retain_until_ms,
            consume,
            leaf.request_id,
            now_ms,
        )
        row = self._call("admit", self._admit_sql, params)
        if row is None or row[0] is None:
            raise StateUnavailable("PostgreSQL state (admit): countersign_admit returned no result")
        code = int(row[0])
        if code == _ACCEPTED:
            return None
        if code == _REPLAYED:
            return StateRejection(Reason.NONCE_REPLAYED, leaf.index)
        if code == _RETRY:
            return EarlierAcceptance(int(row[1] or 0))
        if 0 <= code < len(edges):
            return StateRejection(Reason.FANOUT_EXCEEDED, edges[code].index)
        raise StateUnavailable(f"PostgreSQL state (admit): unexpected result {code}")

    def admit_session(
        self, edges: Sequence[ChildEdge], leaves: Sequence[LeafNonce], *, consume: bool, now_ms: int
    ) -> StateRejection | EarlierAcceptance | None:
        """One statement, ``SELECT countersign_admit_session(...)``: one transaction for the edges and
        every nonce (migration 5; since migration 6 it also answers a retried session's acceptance
        time). The same session admitted by two replicas at once: one inserts the nonces, the other
        waits on the first nonce row, finds it consumed and undoes its writes."""
        check_session_leaves(leaves, self.max_session_leaves if consume else MAX_SESSION_LEAVES)
        request_ids = {leaf.request_id for leaf in leaves}
        if len(request_ids) != 1:
            raise ValueError("a session's receipts are admitted under one request id")
        params = (
            [e.parent_digest for e in edges],
            [e.child_nonce for e in edges],
            [e.max_children for e in edges],
            [e.retain_until_ms for e in edges],
            [leaf.nonce for leaf in leaves],
            [leaf.retain_until_ms for leaf in leaves],
            consume,
            request_ids.pop(),
            now_ms,
        )
        row = self._call("admit session", self._admit_session_sql, params)
        if row is None or row[0] is None:
            raise StateUnavailable("PostgreSQL state (admit session): countersign_admit_session returned no result")
        code = int(row[0])
        if code == _ACCEPTED:
            return None if row[1] is None else EarlierAcceptance(int(row[1]))
        if 0 <= code < len(edges):
            return StateRejection(Reason.FANOUT_EXCEEDED, edges[code].index)
        if -1 - len(leaves) <= code <= -2:  # -1 - (1-based position of the first replayed receipt)
            return StateRejection(Reason.NONCE_REPLAYED, leaves[-2 - code].index)
        raise StateUnavailable(f"PostgreSQL state (admit session): unexpected result {code}")

    @property
    def max_session_leaves(self) -> int:
        return MAX_SESSION_LEAVES

    def collect_expired(self, now_ms: int, limit: int = 10_000) -> int:
        """Delete at most ``limit`` entries (consumed nonces first, then child-set members, oldest
        retention first) whose retention ended before ``now_ms``, in one transaction."""
        if limit <= 0:
            return 0
        row = self._call("collect", self._collect_sql, (now_ms, limit))
        removed = int(row[0]) if row else 0
        if removed < limit:
            with self._connection("collect verdicts") as conn, conn.transaction():
                gone = conn.execute(self._expired_sql, (now_ms, limit - removed)).fetchall()
                removed += self._forget_paths(conn, gone).rows
        return removed

    def entry_count(self) -> int:
        with self._connection("entry count") as conn:
            row = conn.execute(self._count_sql).fetchone()
        return int(row[0]) if row else 0

    # --- the verdict log ---------------------------------------------------------------------

    def record_verdict(self, entry: VerdictEntry) -> None:
        self.record_verdicts([entry])

    @staticmethod
    def _record_params(entry: VerdictEntry, row: tuple[Any, ...] | None = None) -> tuple[Any, ...]:
        path = path_row(entry)
        uses = [] if path is None else use_rows(entry.client, path[1], entry.records)
        return (
            *(path or (entry.client, b"", "", "", 0)), path is not None,
            [u[0] for u in uses], [u[1] for u in uses], *(row or verdict_row(entry)),
        )  # fmt: skip

    def record_verdicts(self, entries: Sequence[VerdictEntry]) -> None:
        """One statement per verdict inside one transaction: one WAL flush for the batch."""
        with self._connection("record verdict") as conn, conn.transaction(), conn.cursor() as cursor:
            cursor.executemany(self._record_sql, [self._record_params(entry) for entry in entries])

    def _move_legacy_verdicts(self, conn: psycopg.Connection[Any]) -> None:
        """The last step of migration 7: the verdicts of schema 3-6 (tables ``verdicts`` and
        ``verdict_signatures``) into the new tables, marks kept, in batches; then the old tables go.
        One transaction under the migration lock; it finds nothing to do once they are gone (a
        release before issue 31 moved them inside migration 7 itself)."""
        ident = sql.Identifier(self.schema)
        conn.execute(
            sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended({}, 0))").format(
                sql.Literal(migration_lock(self.schema))
            )
        )
        legacy = conn.execute(
            "SELECT to_regclass(%s) IS NOT NULL", (sql.Identifier(self.schema, "verdicts").as_string(conn),)
        ).fetchone()
        if not legacy or not legacy[0]:
            return
        last = ""
        while True:
            batch = conn.execute(
                sql.SQL("SELECT {c} FROM {s}.verdicts WHERE verdict_id > %s ORDER BY verdict_id LIMIT 500").format(
                    c=sql.SQL(LEGACY_VERDICT_COLUMNS), s=ident
                ),
                (last,),
            ).fetchall()
            if not batch:
                break
            ids = [row[0] for row in batch]
            signatures = conn.execute(
                sql.SQL("SELECT {c} FROM {s}.verdict_signatures WHERE verdict_id = ANY(%s::text[])").format(
                    c=sql.SQL(LEGACY_SIGNATURE_COLUMNS), s=ident
                ),
                (ids,),
            ).fetchall()
            with conn.cursor() as cursor:
                moved = [self._record_params(e, marked_row(e)) for e in legacy_entries(batch, signatures)]
                cursor.executemany(self._record_sql, moved)
            last = max(ids)
        conn.execute(sql.SQL("DROP TABLE {s}.verdict_signatures, {s}.verdicts").format(s=ident))

    def accepts_relying_on(
        self,
        kind: DependencyKind,
        values: Sequence[str],
        *,
        since_ms: int = 0,
        limit: int = MAX_LOOKUP_VERDICTS,
        client: str | None = None,
    ) -> list[VerdictEntry]:
        params: tuple[Any, ...] = (since_ms, kind_code(kind.value), list(dict.fromkeys(values)))
        params += (() if client is None else (client,)) + (limit,)
        with self._connection("verdict lookup") as conn:
            rows = conn.execute(self._lookup_sql[client is not None], params).fetchall()
        read = PathReader()
        return [entry_from_row(row, row[VERDICT_FIELDS], read(row[VERDICT_FIELDS + 1])) for row in rows]

    def mark_needs_revalidation(self, verdicts: Sequence[VerdictEntry], cause: str, now_ms: int) -> int:
        """Concurrent markers of one verdict queue on its row lock; the later one finds it marked and
        counts nothing (READ COMMITTED re-checks the condition on the row it waited for)."""
        ids = list(dict.fromkeys(v.verdict_id for v in verdicts))
        if not ids:
            return 0
        with self._connection("mark verdicts") as conn:
            return int(conn.execute(self._mark_sql, (bounded_cause(cause), now_ms, ids)).rowcount)

    def _forget_paths(self, conn: psycopg.Connection[Any], gone: Sequence[Any]) -> ClientUsage:
        """After deleting the ``verdict_log`` rows ``gone`` (client, path digest, bytes), in the same
        transaction: drop each path no verdict of its client names any more, with its index entries.
        The path rows are locked first, so a verdict being recorded on one (which locks it too) is
        either seen by the check that follows or records the path afresh after it went."""
        freed = sum(int(row[2]) for row in gone)
        by_client: dict[str, list[bytes]] = {}
        for client, digest, _ in gone:
            if digest is not None and bytes(digest) not in by_client.setdefault(client, []):
                by_client[client].append(bytes(digest))
        for client, digests in sorted(by_client.items()):
            conn.execute(self._lock_paths_sql, (client, sorted(digests)))
            dropped = conn.execute(self._orphans_sql, (client, sorted(digests))).fetchall()
            uses = [
                u for digest, records, _ in dropped for u in use_rows(client, bytes(digest), records_from_json(records))
            ]
            if uses:
                conn.execute(self._drop_uses_sql, [list(column) for column in zip(*uses, strict=True)])
            freed += sum(int(size) for _, _, size in dropped)
        return ClientUsage(len(gone), freed)

    def verdict_usage(self) -> dict[str, ClientUsage]:
        with self._connection("verdict usage") as conn:
            return {str(c): ClientUsage(int(n), int(b)) for c, n, b in conn.execute(self._usage_sql).fetchall()}

    def trim_verdict_log(self, max_rows: int, limit: int = 10_000, *, max_bytes: int | None = None) -> int:
        def forget_oldest(client: str, count: int) -> ClientUsage:
            with self._connection("trim verdicts") as conn, conn.transaction():
                gone = conn.execute(self._oldest_sql, (client, count)).fetchall()
                return self._forget_paths(conn, gone)

        return trim_by_share(self.verdict_usage(), max_rows, max_bytes, limit, forget_oldest)

    def verdict_count(self) -> int:
        with self._connection("verdict count") as conn:
            row = conn.execute(self._verdict_count_sql).fetchone()
        return int(row[0]) if row else 0

    def close(self) -> None:
        self._db.close()
