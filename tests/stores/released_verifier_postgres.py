"""The verifier's PostgreSQL schema as the release before issue 31 made it: a recorded copy of the
migrations that ``verifier/stores/postgres.py`` kept as Python strings (commit a6f7a47), and of the
loop that applied them, so a test can build a schema at any of its versions exactly as a deployment
running that release has it, then open it with the current code (tests/stores/test_store_migrations.py).

Do not edit the statements: they are what existing deployments ran.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

VERSION_TABLE = "countersign_schema_version"

MOVE_LEGACY = "MOVE LEGACY VERDICTS"  # a migration step run in Python, not a statement

# Each entry is one migration: its statements run in one transaction under the migration lock.
# ``{schema}`` is replaced by the quoted schema name; nothing else in these texts uses braces.
MIGRATIONS: dict[int, tuple[str, ...]] = {
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
        MOVE_LEGACY,
        "DROP TABLE {schema}.verdict_signatures",
        "DROP TABLE {schema}.verdicts",
    ),
}


def create_as_released(base_url: str, schema: str, version: int) -> None:
    """Bring ``schema`` to ``version`` as the released code did: one transaction per migration, the
    version table in the schema, statements naming the schema. Migration 7's data move is left out (a
    schema made here holds no verdict of the layout before it)."""
    ident = sql.Identifier(schema)
    with psycopg.connect(base_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.countersign_schema_version ("
                " version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        for step in range(1, version + 1):
            with conn.transaction():
                for statement in MIGRATIONS[step]:
                    if statement != MOVE_LEGACY:
                        conn.execute(sql.SQL(statement).format(schema=ident))  # type: ignore[arg-type]
                conn.execute(
                    sql.SQL("INSERT INTO {}.countersign_schema_version (version) VALUES (%s)").format(ident), (step,)
                )
