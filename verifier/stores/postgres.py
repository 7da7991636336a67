"""PostgreSQL verifier state: one database shared by any number of verifier replicas.

URL: ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DBNAME[?PARAMS]``. Every libpq parameter passes
through (``sslmode``, ``options``, ...); the store reads its own parameters and strips them:

* ``schema``: the schema holding the tables (default ``countersign``; also taken from
  ``options=-csearch_path=NAME`` when ``schema`` is absent). Created if missing.
* ``connect_timeout``: seconds to wait for a connection, also the longest an admit waits for a free
  pooled connection while the server is down (default 3).
* ``statement_timeout_ms``: server-side bound on one statement, lock waits included (default 10000).
* ``pool_min_size`` / ``pool_max_size``: connection pool bounds (default 1 / 8).

The password, when the URL has none, comes from ``COUNTERSIGN_STORE_PASSWORD`` (then libpq's own
``PGPASSWORD`` / ``.pgpass``).

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

import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import ConnectionPool, PoolTimeout

from countersign.errors import StateUnavailable
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

SCHEMA_VERSION = 7
DEFAULT_SCHEMA = "countersign"
PASSWORD_ENV = "COUNTERSIGN_STORE_PASSWORD"  # noqa: S105 - the NAME of the variable, not a password
_OWN_PARAMS = ("schema", "statement_timeout_ms", "pool_min_size", "pool_max_size")
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]{0,62}")
_SEARCH_PATH = re.compile(r"-c\s*search_path\s*=\s*([^\s,]+)")
# Deadlocks cannot arise between admits (parents are locked in one order), but a retry on these
# codes costs nothing: the transaction was rolled back as a whole, so nothing was recorded.
_RETRYABLE_SQLSTATES = frozenset({"40001", "40P01"})
_ADMIT_ATTEMPTS = 3

# Result codes of countersign_admit: >= 0 is the position (in the edge list) of a fan-out rejection.
_ACCEPTED = -1
_REPLAYED = -2
_RETRY = -3  # consumed before under the same request id: the second column is when

_MOVE_LEGACY = "MOVE LEGACY VERDICTS"  # a migration step run in Python, not a statement

# Each entry is one migration: its statements run in one transaction under the migration lock.
# ``{schema}`` is replaced by the quoted schema name; nothing else in these texts uses braces.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE {schema}.consumed_nonces ( nonce text PRIMARY KEY, retain_until_ms bigint NOT NULL)",
        "CREATE INDEX consumed_nonces_retention ON {schema}.consumed_nonces (retain_until_ms)",
        # One row per parent that has (or had) children: the row every admit locks, and the count.
        "CREATE TABLE {schema}.child_sets ("
        " parent text PRIMARY KEY, child_count integer NOT NULL CHECK (child_count >= 0),"
        " retain_until_ms bigint NOT NULL)",
        "CREATE INDEX child_sets_retention ON {schema}.child_sets (retain_until_ms)",
        "CREATE TABLE {schema}.children ("
        " parent text NOT NULL, child text NOT NULL, retain_until_ms bigint NOT NULL,"
        " PRIMARY KEY (parent, child))",
        "CREATE INDEX children_retention ON {schema}.children (retain_until_ms)",
        """
CREATE FUNCTION {schema}.countersign_admit(
    p_parents text[], p_children text[], p_max integer[], p_retain bigint[],
    p_nonce text, p_nonce_retain bigint, p_consume boolean) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    n integer := coalesce(array_length(p_parents, 1), 0);
    held integer;
BEGIN
    IF p_consume AND n > 0 THEN
        -- Lock every parent's counter row, creating missing ones, in one global order: concurrent
        -- admits that share parents queue on the rows instead of deadlocking.
        INSERT INTO {schema}.child_sets AS s (parent, child_count, retain_until_ms)
            SELECT e.parent, 0, max(e.retain) FROM unnest(p_parents, p_retain) AS e(parent, retain)
            GROUP BY e.parent ORDER BY e.parent
        ON CONFLICT (parent) DO UPDATE
            SET retain_until_ms = greatest(s.retain_until_ms, EXCLUDED.retain_until_ms);
    END IF;
    -- Check every edge against the state before this path (as the reference implementation does).
    FOR i IN 1 .. n LOOP
        PERFORM 1 FROM {schema}.children WHERE parent = p_parents[i] AND child = p_children[i];
        IF NOT FOUND THEN
            held := NULL;
            SELECT child_count INTO held FROM {schema}.child_sets WHERE parent = p_parents[i];
            IF coalesce(held, 0) >= p_max[i] THEN
                RETURN i - 1;
            END IF;
        END IF;
    END LOOP;
    IF NOT p_consume THEN
        RETURN -1;
    END IF;
    FOR i IN 1 .. n LOOP
        INSERT INTO {schema}.children (parent, child, retain_until_ms)
            VALUES (p_parents[i], p_children[i], p_retain[i]) ON CONFLICT DO NOTHING;
        IF FOUND THEN
            UPDATE {schema}.child_sets SET child_count = child_count + 1 WHERE parent = p_parents[i];
        END IF;
    END LOOP;
    INSERT INTO {schema}.consumed_nonces (nonce, retain_until_ms) VALUES (p_nonce, p_nonce_retain)
        ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN -2;
    END IF;
    RETURN -1;
END
$fn$
""",
        """
CREATE FUNCTION {schema}.countersign_collect(p_now bigint, p_limit integer) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    removed integer;
    gone integer;
    v_parents text[];
    v_children text[];
    v_gone text[];
BEGIN
    DELETE FROM {schema}.consumed_nonces WHERE nonce IN (
        SELECT nonce FROM {schema}.consumed_nonces WHERE retain_until_ms < p_now
        ORDER BY retain_until_ms LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF removed >= p_limit THEN
        RETURN removed;
    END IF;
    SELECT array_agg(v.parent), array_agg(v.child) INTO v_parents, v_children FROM (
        SELECT parent, child FROM {schema}.children WHERE retain_until_ms < p_now
        ORDER BY retain_until_ms LIMIT p_limit - removed) AS v;
    IF v_parents IS NOT NULL THEN
        -- Same lock order as countersign_admit (parents sorted, before any child row), so the
        -- collector never deadlocks with an admit.
        PERFORM 1 FROM {schema}.child_sets WHERE parent = ANY (v_parents) ORDER BY parent FOR UPDATE;
        WITH d AS (
            DELETE FROM {schema}.children AS c USING unnest(v_parents, v_children) AS v(parent, child)
            WHERE c.parent = v.parent AND c.child = v.child AND c.retain_until_ms < p_now
            RETURNING c.parent)
        SELECT array_agg(d.parent) INTO v_gone FROM d;
        gone := coalesce(cardinality(v_gone), 0);
        IF gone > 0 THEN
            UPDATE {schema}.child_sets AS s SET child_count = s.child_count - g.k
            FROM (SELECT parent, count(*)::integer AS k FROM unnest(v_gone) AS parent GROUP BY parent) AS g
            WHERE s.parent = g.parent;
        END IF;
        removed := removed + gone;
    END IF;
    -- Counter rows of parents with no child left and past retention: not entries, just tidying.
    DELETE FROM {schema}.child_sets WHERE parent IN (
        SELECT parent FROM {schema}.child_sets WHERE child_count = 0 AND retain_until_ms < p_now
        LIMIT p_limit FOR UPDATE SKIP LOCKED);
    RETURN removed;
END
$fn$
""",
    ),
    # An idempotency key with each consumed nonce: the same request retried gets its ACCEPT again.
    2: (
        "ALTER TABLE {schema}.consumed_nonces ADD COLUMN request_id text NOT NULL DEFAULT ''",
        "DROP FUNCTION {schema}.countersign_admit(text[], text[], integer[], bigint[], text, bigint, boolean)",
        """
CREATE FUNCTION {schema}.countersign_admit(
    p_parents text[], p_children text[], p_max integer[], p_retain bigint[],
    p_nonce text, p_nonce_retain bigint, p_consume boolean, p_request_id text) RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    n integer := coalesce(array_length(p_parents, 1), 0);
    held integer;
BEGIN
    IF p_consume AND n > 0 THEN
        INSERT INTO {schema}.child_sets AS s (parent, child_count, retain_until_ms)
            SELECT e.parent, 0, max(e.retain) FROM unnest(p_parents, p_retain) AS e(parent, retain)
            GROUP BY e.parent ORDER BY e.parent
        ON CONFLICT (parent) DO UPDATE
            SET retain_until_ms = greatest(s.retain_until_ms, EXCLUDED.retain_until_ms);
    END IF;
    FOR i IN 1 .. n LOOP
        PERFORM 1 FROM {schema}.children WHERE parent = p_parents[i] AND child = p_children[i];
        IF NOT FOUND THEN
            held := NULL;
            SELECT child_count INTO held FROM {schema}.child_sets WHERE parent = p_parents[i];
            IF coalesce(held, 0) >= p_max[i] THEN
                RETURN i - 1;
            END IF;
        END IF;
    END LOOP;
    IF NOT p_consume THEN
        RETURN -1;
    END IF;
    FOR i IN 1 .. n LOOP
        INSERT INTO {schema}.children (parent, child, retain_until_ms)
            VALUES (p_parents[i], p_children[i], p_retain[i]) ON CONFLICT DO NOTHING;
        IF FOUND THEN
            UPDATE {schema}.child_sets SET child_count = child_count + 1 WHERE parent = p_parents[i];
        END IF;
    END LOOP;
    INSERT INTO {schema}.consumed_nonces (nonce, retain_until_ms, request_id)
        VALUES (p_nonce, p_nonce_retain, p_request_id) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        IF p_request_id <> '' THEN
            PERFORM 1 FROM {schema}.consumed_nonces WHERE nonce = p_nonce AND request_id = p_request_id;
            IF FOUND THEN
                RETURN -1;
            END IF;
        END IF;
        RETURN -2;
    END IF;
    RETURN -1;
END
$fn$
""",
    ),
    # The verdict log: one row per verdict, one per signature its records carry, each signature row
    # with the verdict's time so "relied on K since T" is one range of one index.
    3: (
        "CREATE TABLE {schema}.verdicts ("
        " verdict_id text PRIMARY KEY, time_ms bigint NOT NULL, mode text NOT NULL, client text NOT NULL,"
        " request_id text NOT NULL, registry_sequence bigint NOT NULL, verdict text NOT NULL,"
        " reason text NOT NULL, construction text NOT NULL, retain_until_ms bigint NOT NULL,"
        " needs_revalidation boolean NOT NULL DEFAULT false, revalidation_cause text NOT NULL DEFAULT '',"
        " marked_ms bigint)",
        "CREATE INDEX verdicts_by_time ON {schema}.verdicts (time_ms, verdict_id)",
        "CREATE INDEX verdicts_retention ON {schema}.verdicts (retain_until_ms)",
        "CREATE TABLE {schema}.verdict_signatures ("
        " verdict_id text NOT NULL REFERENCES {schema}.verdicts (verdict_id) ON DELETE CASCADE,"
        " position integer NOT NULL, role text NOT NULL, record_digest text NOT NULL, deployer text NOT NULL,"
        " key_id text NOT NULL, created_ms bigint NOT NULL, time_ms bigint NOT NULL,"
        " PRIMARY KEY (verdict_id, position, role))",
        "CREATE INDEX verdict_signatures_by_key ON {schema}.verdict_signatures (key_id, time_ms)",
        "CREATE INDEX verdict_signatures_by_record ON {schema}.verdict_signatures (record_digest, time_ms)",
        "CREATE INDEX verdict_signatures_by_deployer ON {schema}.verdict_signatures (deployer, time_ms)",
    ),
    # When each nonce was consumed, so that a retry's answer names the acceptance it repeats (0 for
    # nonces consumed before); countersign_admit takes the time and answers it with code -3.
    4: (
        "ALTER TABLE {schema}.consumed_nonces ADD COLUMN accepted_ms bigint NOT NULL DEFAULT 0",
        "DROP FUNCTION {schema}.countersign_admit(text[], text[], integer[], bigint[], text, bigint, boolean, text)",
        """
CREATE FUNCTION {schema}.countersign_admit(
    p_parents text[], p_children text[], p_max integer[], p_retain bigint[],
    p_nonce text, p_nonce_retain bigint, p_consume boolean, p_request_id text, p_now bigint,
    OUT code integer, OUT accepted bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    n integer := coalesce(array_length(p_parents, 1), 0);
    held integer;
BEGIN
    IF p_consume AND n > 0 THEN
        INSERT INTO {schema}.child_sets AS s (parent, child_count, retain_until_ms)
            SELECT e.parent, 0, max(e.retain) FROM unnest(p_parents, p_retain) AS e(parent, retain)
            GROUP BY e.parent ORDER BY e.parent
        ON CONFLICT (parent) DO UPDATE
            SET retain_until_ms = greatest(s.retain_until_ms, EXCLUDED.retain_until_ms);
    END IF;
    FOR i IN 1 .. n LOOP
        PERFORM 1 FROM {schema}.children WHERE parent = p_parents[i] AND child = p_children[i];
        IF NOT FOUND THEN
            held := NULL;
            SELECT child_count INTO held FROM {schema}.child_sets WHERE parent = p_parents[i];
            IF coalesce(held, 0) >= p_max[i] THEN
                code := i - 1;
                RETURN;
            END IF;
        END IF;
    END LOOP;
    IF NOT p_consume THEN
        code := -1;
        RETURN;
    END IF;
    FOR i IN 1 .. n LOOP
        INSERT INTO {schema}.children (parent, child, retain_until_ms)
            VALUES (p_parents[i], p_children[i], p_retain[i]) ON CONFLICT DO NOTHING;
        IF FOUND THEN
            UPDATE {schema}.child_sets SET child_count = child_count + 1 WHERE parent = p_parents[i];
        END IF;
    END LOOP;
    INSERT INTO {schema}.consumed_nonces (nonce, retain_until_ms, request_id, accepted_ms)
        VALUES (p_nonce, p_nonce_retain, p_request_id, p_now) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        IF p_request_id <> '' THEN
            SELECT c.accepted_ms INTO accepted FROM {schema}.consumed_nonces AS c
                WHERE c.nonce = p_nonce AND c.request_id = p_request_id;
            IF FOUND THEN
                code := -3;
                RETURN;
            END IF;
        END IF;
        code := -2;
        RETURN;
    END IF;
    code := -1;
END
$fn$
""",
    ),
    # Sessions (docs/spec.md 17.5): the agent path's edges and every receipt's nonce in one statement,
    # all or nothing. The writes run in a block whose exception handler undoes them (a subtransaction),
    # so a nonce found consumed leaves nothing behind. Nonces are inserted in sorted order, so two
    # admissions sharing nonces queue on the rows instead of deadlocking.
    5: (
        """
CREATE FUNCTION {schema}.countersign_admit_session(
    p_parents text[], p_children text[], p_max integer[], p_retain bigint[],
    p_nonces text[], p_nonce_retain bigint[], p_consume boolean, p_request_id text, p_now bigint)
    RETURNS integer
LANGUAGE plpgsql AS $fn$
DECLARE
    n integer := coalesce(array_length(p_parents, 1), 0);
    held integer;
    k integer;
    previous text := NULL;
    replayed integer := NULL;
BEGIN
    IF p_consume AND n > 0 THEN
        INSERT INTO {schema}.child_sets AS s (parent, child_count, retain_until_ms)
            SELECT e.parent, 0, max(e.retain) FROM unnest(p_parents, p_retain) AS e(parent, retain)
            GROUP BY e.parent ORDER BY e.parent
        ON CONFLICT (parent) DO UPDATE
            SET retain_until_ms = greatest(s.retain_until_ms, EXCLUDED.retain_until_ms);
    END IF;
    FOR i IN 1 .. n LOOP
        PERFORM 1 FROM {schema}.children WHERE parent = p_parents[i] AND child = p_children[i];
        IF NOT FOUND THEN
            held := NULL;
            SELECT child_count INTO held FROM {schema}.child_sets WHERE parent = p_parents[i];
            IF coalesce(held, 0) >= p_max[i] THEN
                RETURN i - 1;
            END IF;
        END IF;
    END LOOP;
    IF NOT p_consume THEN
        RETURN -1;
    END IF;
    BEGIN
        FOR i IN 1 .. n LOOP
            INSERT INTO {schema}.children (parent, child, retain_until_ms)
                VALUES (p_parents[i], p_children[i], p_retain[i]) ON CONFLICT DO NOTHING;
            IF FOUND THEN
                UPDATE {schema}.child_sets SET child_count = child_count + 1 WHERE parent = p_parents[i];
            END IF;
        END LOOP;
        FOR k IN SELECT u.i::integer FROM unnest(p_nonces) WITH ORDINALITY AS u(nonce, i) ORDER BY u.nonce, u.i
        LOOP
            IF p_nonces[k] = previous THEN
                -- the session repeats a nonce: it cannot consume it twice
                replayed := least(coalesce(replayed, k), k);
                CONTINUE;
            END IF;
            previous := p_nonces[k];
            INSERT INTO {schema}.consumed_nonces (nonce, retain_until_ms, request_id, accepted_ms)
                VALUES (p_nonces[k], p_nonce_retain[k], p_request_id, p_now) ON CONFLICT DO NOTHING;
            IF NOT FOUND THEN
                PERFORM 1 FROM {schema}.consumed_nonces
                    WHERE nonce = p_nonces[k] AND p_request_id <> '' AND request_id = p_request_id;
                IF NOT FOUND THEN
                    replayed := least(coalesce(replayed, k), k);
                END IF;
            END IF;
        END LOOP;
        IF replayed IS NOT NULL THEN
            RAISE EXCEPTION 'session nonce replayed' USING ERRCODE = 'CS001';
        END IF;
    EXCEPTION WHEN SQLSTATE 'CS001' THEN
        RETURN -1 - replayed;
    END;
    RETURN -1;
END
$fn$
""",
    ),
    # A retried session says so (docs/spec.md 17.5): when every receipt's nonce was consumed before
    # under the request id, ``accepted`` is the latest of their acceptance times (else NULL).
    6: (
        "DROP FUNCTION {schema}.countersign_admit_session("
        "text[], text[], integer[], bigint[], text[], bigint[], boolean, text, bigint)",
        """
CREATE FUNCTION {schema}.countersign_admit_session(
    p_parents text[], p_children text[], p_max integer[], p_retain bigint[],
    p_nonces text[], p_nonce_retain bigint[], p_consume boolean, p_request_id text, p_now bigint,
    OUT code integer, OUT accepted bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    n integer := coalesce(array_length(p_parents, 1), 0);
    held integer;
    k integer;
    previous text := NULL;
    replayed integer := NULL;
    retried integer := 0;
    earlier bigint;
BEGIN
    IF p_consume AND n > 0 THEN
        INSERT INTO {schema}.child_sets AS s (parent, child_count, retain_until_ms)
            SELECT e.parent, 0, max(e.retain) FROM unnest(p_parents, p_retain) AS e(parent, retain)
            GROUP BY e.parent ORDER BY e.parent
        ON CONFLICT (parent) DO UPDATE
            SET retain_until_ms = greatest(s.retain_until_ms, EXCLUDED.retain_until_ms);
    END IF;
    FOR i IN 1 .. n LOOP
        PERFORM 1 FROM {schema}.children WHERE parent = p_parents[i] AND child = p_children[i];
        IF NOT FOUND THEN
            held := NULL;
            SELECT child_count INTO held FROM {schema}.child_sets WHERE parent = p_parents[i];
            IF coalesce(held, 0) >= p_max[i] THEN
                code := i - 1;
                RETURN;
            END IF;
        END IF;
    END LOOP;
    IF NOT p_consume THEN
        code := -1;
        RETURN;
    END IF;
    BEGIN
        FOR i IN 1 .. n LOOP
            INSERT INTO {schema}.children (parent, child, retain_until_ms)
                VALUES (p_parents[i], p_children[i], p_retain[i]) ON CONFLICT DO NOTHING;
            IF FOUND THEN
                UPDATE {schema}.child_sets SET child_count = child_count + 1 WHERE parent = p_parents[i];
            END IF;
        END LOOP;
        FOR k IN SELECT u.i::integer FROM unnest(p_nonces) WITH ORDINALITY AS u(nonce, i) ORDER BY u.nonce, u.i
        LOOP
            IF p_nonces[k] = previous THEN
                -- the session repeats a nonce: it cannot consume it twice
                replayed := least(coalesce(replayed, k), k);
                CONTINUE;
            END IF;
            previous := p_nonces[k];
            INSERT INTO {schema}.consumed_nonces (nonce, retain_until_ms, request_id, accepted_ms)
                VALUES (p_nonces[k], p_nonce_retain[k], p_request_id, p_now) ON CONFLICT DO NOTHING;
            IF NOT FOUND THEN
                SELECT c.accepted_ms INTO earlier FROM {schema}.consumed_nonces AS c
                    WHERE c.nonce = p_nonces[k] AND p_request_id <> '' AND c.request_id = p_request_id;
                IF NOT FOUND THEN
                    replayed := least(coalesce(replayed, k), k);
                ELSE
                    retried := retried + 1;
                    accepted := greatest(accepted, earlier);
                END IF;
            END IF;
        END LOOP;
        IF replayed IS NOT NULL THEN
            RAISE EXCEPTION 'session nonce replayed' USING ERRCODE = 'CS001';
        END IF;
    EXCEPTION WHEN SQLSTATE 'CS001' THEN
        code := -1 - replayed;
        accepted := NULL;
        RETURN;
    END;
    code := -1;
    IF retried < array_length(p_nonces, 1) THEN
        accepted := NULL;  -- this call consumed something: not a retry
    END IF;
END
$fn$
""",
    ),
    # Issue 29: what repeats stored once per client (verifier/stores/verdict_rows.py). The verdicts of
    # versions 3-6 move over (PostgresState._move_legacy_verdicts), then their tables go.
    7: (
        "CREATE TABLE {schema}.verdict_log ("
        " verdict_id text NOT NULL UNIQUE, time_ms bigint NOT NULL, mode text NOT NULL, client text NOT NULL,"
        " request_id text NOT NULL, registry_sequence bigint NOT NULL, verdict text NOT NULL, reason text NOT NULL,"
        " path_digest bytea, retain_until_ms bigint NOT NULL, needs_revalidation boolean NOT NULL DEFAULT false,"
        " revalidation_cause text NOT NULL DEFAULT '', bytes integer NOT NULL, marked_ms bigint)",
        "CREATE INDEX verdict_log_by_path ON {schema}.verdict_log (client, path_digest, time_ms)",
        "CREATE INDEX verdict_log_by_client ON {schema}.verdict_log (client, time_ms, verdict_id)",
        "CREATE INDEX verdict_log_retention ON {schema}.verdict_log (retain_until_ms)",
        "CREATE TABLE {schema}.verdict_paths ("
        " client text NOT NULL, path_digest bytea NOT NULL, construction text NOT NULL, records text NOT NULL,"
        " bytes integer NOT NULL, PRIMARY KEY (client, path_digest))",
        "CREATE TABLE {schema}.verdict_path_uses ("
        " kind text NOT NULL, value text NOT NULL, client text NOT NULL, path_digest bytea NOT NULL,"
        " PRIMARY KEY (kind, value, client, path_digest))",
        _MOVE_LEGACY,
        "DROP TABLE {schema}.verdict_signatures",
        "DROP TABLE {schema}.verdicts",
    ),
}


def _schema_from_options(options: str | None) -> str | None:
    if not options:
        return None
    found = _SEARCH_PATH.search(options)
    if found is None:
        return None
    return found.group(1).strip("\"'")


def _positive_int(params: dict[str, str], name: str, default: int) -> int:
    raw = params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        from verifier.stores import StoreConfigError

        raise StoreConfigError(f"PostgreSQL URL parameter {name} must be a positive integer, got {raw!r}")
    return value


def parse_url(url: str) -> tuple[str, str, dict[str, int]]:
    """Split a store URL into (libpq conninfo, schema, store settings). Raises StoreConfigError."""
    from verifier.stores import StoreConfigError

    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise StoreConfigError(f"not a PostgreSQL URL: {url!r}")
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in _OWN_PARAMS}
    passed = [(k, v) for k, v in query if k not in _OWN_PARAMS]
    # libpq decodes %XX only: a space must go back as %20, not as urlencode's default "+".
    libpq_url = urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(passed, quote_via=quote), ""))
    try:
        params: dict[str, Any] = conninfo_to_dict(libpq_url)
    except psycopg.ProgrammingError as exc:
        raise StoreConfigError(f"invalid PostgreSQL URL: {exc}") from exc
    schema = own.get("schema") or _schema_from_options(params.get("options")) or DEFAULT_SCHEMA
    if not _SCHEMA_NAME.fullmatch(schema):
        raise StoreConfigError(f"schema must be a plain identifier, got {schema!r}")
    connect_timeout = _positive_int({k: str(v) for k, v in params.items()}, "connect_timeout", 3)
    settings = {
        "connect_timeout": connect_timeout,
        "statement_timeout_ms": _positive_int(own, "statement_timeout_ms", 10_000),
        "pool_min_size": _positive_int(own, "pool_min_size", 1),
        "pool_max_size": _positive_int(own, "pool_max_size", 8),
    }
    if settings["pool_min_size"] > settings["pool_max_size"]:
        raise StoreConfigError("pool_min_size must not exceed pool_max_size")
    extra: dict[str, Any] = {"connect_timeout": max(connect_timeout, 2)}
    # Dead peers are noticed within seconds, not after the kernel's default of many minutes.
    for key, value in (
        ("keepalives", 1),
        ("keepalives_idle", 5),
        ("keepalives_interval", 2),
        ("keepalives_count", 3),
        ("tcp_user_timeout", 10_000),
    ):
        params.setdefault(key, value)
    if "password" not in params and os.environ.get(PASSWORD_ENV):
        extra["password"] = os.environ[PASSWORD_ENV]
    params.setdefault("application_name", "countersign-verifier")
    return make_conninfo("", **{**params, **extra}), schema, settings


class PostgresState:
    """:class:`countersign.state.VerifierState` in a PostgreSQL schema shared by verifier replicas."""

    def __init__(self, url: str) -> None:
        conninfo, self.schema, settings = parse_url(url)
        self._timeout = float(settings["connect_timeout"])
        self._statement_timeout_ms = settings["statement_timeout_ms"]
        self._checking = threading.Lock()
        self._pool = ConnectionPool(
            conninfo,
            min_size=settings["pool_min_size"],
            max_size=settings["pool_max_size"],
            kwargs={"autocommit": True},
            configure=self._configure,
            timeout=self._timeout,
            # Short on purpose: psycopg_pool doubles the delay between reconnection attempts without a
            # cap until reconnect_timeout, so with a long one a verifier stayed unavailable after an
            # outage for about as long again as the outage lasted. A chain that gives up frees its
            # slot and the next request starts a fresh one, so reconnection follows within seconds.
            reconnect_timeout=5.0,
            name=f"countersign-{self.schema}",
            open=False,
        )
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
            self._pool.open(wait=True, timeout=self._timeout)
        except PoolTimeout as exc:
            self._pool.close(timeout=0)
            raise StateUnavailable(f"PostgreSQL state: no connection within {self._timeout:g} s: {exc}") from exc
        try:
            self.migrate()
        except BaseException:
            self._pool.close(timeout=0)
            raise

    def _configure(self, conn: psycopg.Connection[Any]) -> None:
        conn.execute(sql.SQL("SET statement_timeout = {}").format(sql.Literal(self._statement_timeout_ms)))

    @contextmanager
    def _connection(self, what: str) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; every driver or pool failure becomes StateUnavailable."""
        try:
            with self._pool.connection(timeout=self._timeout) as conn:
                yield conn
        except PoolTimeout as exc:
            raise StateUnavailable(
                f"PostgreSQL state ({what}): no connection within {self._timeout:g} s; server down or pool exhausted"
            ) from exc
        except psycopg.OperationalError as exc:
            self._recheck_pool()
            raise StateUnavailable(f"PostgreSQL state ({what}): {exc}".rstrip()) from exc
        except psycopg.Error as exc:
            raise StateUnavailable(f"PostgreSQL state ({what}): {type(exc).__name__}: {exc}".rstrip()) from exc

    def _recheck_pool(self) -> None:
        """After a connection failure (say, a server restart), drop the other dead idle connections in
        the background so the next admits get fresh ones instead of failing one by one."""
        if not self._checking.acquire(blocking=False):
            return

        def run() -> None:
            try:
                self._pool.check()
            except Exception:  # noqa: S110 - best effort; the pool reconnects on demand anyway
                pass
            finally:
                self._checking.release()

        threading.Thread(target=run, name="countersign-pg-check", daemon=True).start()

    def migrate(self) -> int:
        """Bring the schema to :data:`SCHEMA_VERSION`; idempotent and safe to run concurrently.

        Each migration runs in its own transaction holding a transaction-scoped advisory lock keyed
        by the schema name, and re-reads the version under that lock, so concurrent starters apply
        every migration exactly once. Returns the version found before migrating.
        """
        ident = sql.Identifier(self.schema)
        lock = sql.SQL("SELECT pg_advisory_xact_lock(hashtextextended({}, 0))").format(
            sql.Literal(f"countersign-schema:{self.schema}")
        )
        found: int | None = None
        with self._connection("migrate") as conn:
            for step in range(1, SCHEMA_VERSION + 1):
                with conn.transaction():
                    conn.execute(lock)
                    conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
                    conn.execute(
                        sql.SQL(
                            "CREATE TABLE IF NOT EXISTS {}.countersign_schema_version ("
                            " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
                        ).format(ident)
                    )
                    row = conn.execute(
                        sql.SQL("SELECT coalesce(max(version), 0) FROM {}.countersign_schema_version").format(ident)
                    ).fetchone()
                    version = int(row[0]) if row else 0
                    if found is None:
                        found = version
                    if version > SCHEMA_VERSION:
                        raise StateUnavailable(
                            f"PostgreSQL schema {self.schema} has version {version}, newer than this software"
                            f" ({SCHEMA_VERSION})"
                        )
                    if version >= step:
                        continue
                    for statement in _MIGRATIONS[step]:
                        if statement == _MOVE_LEGACY:
                            self._move_legacy_verdicts(conn)
                        else:
                            conn.execute(sql.SQL(statement).format(schema=ident))
                    conn.execute(
                        sql.SQL("INSERT INTO {}.countersign_schema_version (version) VALUES (%s)").format(ident),
                        (step,),
                    )
        return found or 0

    def schema_version(self) -> int:
        with self._connection("schema version") as conn:
            row = conn.execute(
                sql.SQL("SELECT coalesce(max(version), 0) FROM {}.countersign_schema_version").format(
                    sql.Identifier(self.schema)
                )
            ).fetchone()
        return int(row[0]) if row else 0

    def _call(self, what: str, query: sql.Composed, params: Sequence[Any]) -> tuple[Any, ...] | None:
        """Run one statement (one transaction, autocommit) and return its row. A deadlock or
        serialisation failure rolled the transaction back whole, so it is retried; nothing else is."""
        for attempt in range(_ADMIT_ATTEMPTS):
            try:
                with self._connection(what) as conn:
                    return conn.execute(query, params).fetchone()
            except StateUnavailable as exc:
                cause = exc.__cause__
                retry = isinstance(cause, psycopg.Error) and cause.sqlstate in _RETRYABLE_SQLSTATES
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
        """Migration 7: the verdicts of schema 3-6 into the new tables, marks kept, in batches."""
        ident = sql.Identifier(self.schema)
        last = ""
        while True:
            batch = conn.execute(
                sql.SQL("SELECT {c} FROM {s}.verdicts WHERE verdict_id > %s ORDER BY verdict_id LIMIT 500").format(
                    c=sql.SQL(LEGACY_VERDICT_COLUMNS), s=ident
                ),
                (last,),
            ).fetchall()
            if not batch:
                return
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
        self._pool.close(timeout=self._timeout)
