-- Version 1: replay state. Consumed leaf nonces, and each parent's child set with the counter row every
-- admit locks; countersign_admit (a whole admit in one statement) and countersign_collect.
-- Applied by countersign/_daemon/postgres.py (PostgresDatabase.migrate) with search_path set to the
-- verifier's schema: nothing here names a schema, and each function pins it (SET search_path FROM CURRENT).
-- Released migrations are never edited: a change is a new file (docs/stores.md, Migration policy).

CREATE TABLE consumed_nonces (
    nonce text PRIMARY KEY,
    retain_until_ms bigint NOT NULL
);
CREATE INDEX consumed_nonces_retention ON consumed_nonces (retain_until_ms);

-- One row per parent that has (or had) children: the row every admit locks, and the count.
CREATE TABLE child_sets (
    parent text PRIMARY KEY,
    child_count integer NOT NULL CHECK (child_count >= 0),
    retain_until_ms bigint NOT NULL
);
CREATE INDEX child_sets_retention ON child_sets (retain_until_ms);

CREATE TABLE children (
    parent text NOT NULL,
    child text NOT NULL,
    retain_until_ms bigint NOT NULL,
    PRIMARY KEY (parent, child)
);
CREATE INDEX children_retention ON children (retain_until_ms);

CREATE FUNCTION countersign_admit(
    p_parents text[], p_children text[], p_max integer[], p_retain bigint[],
    p_nonce text, p_nonce_retain bigint, p_consume boolean) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE
    n integer := coalesce(array_length(p_parents, 1), 0);
    held integer;
BEGIN
    IF p_consume AND n > 0 THEN
        -- Lock every parent's counter row, creating missing ones, in one global order: concurrent
        -- admits that share parents queue on the rows instead of deadlocking.
        INSERT INTO child_sets AS s (parent, child_count, retain_until_ms)
            SELECT e.parent, 0, max(e.retain) FROM unnest(p_parents, p_retain) AS e(parent, retain)
            GROUP BY e.parent ORDER BY e.parent
        ON CONFLICT (parent) DO UPDATE
            SET retain_until_ms = greatest(s.retain_until_ms, EXCLUDED.retain_until_ms);
    END IF;
    -- Check every edge against the state before this path (as the reference implementation does).
    FOR i IN 1 .. n LOOP
        PERFORM 1 FROM children WHERE parent = p_parents[i] AND child = p_children[i];
        IF NOT FOUND THEN
            held := NULL;
            SELECT child_count INTO held FROM child_sets WHERE parent = p_parents[i];
            IF coalesce(held, 0) >= p_max[i] THEN
                RETURN i - 1;
            END IF;
        END IF;
    END LOOP;
    IF NOT p_consume THEN
        RETURN -1;
    END IF;
    FOR i IN 1 .. n LOOP
        INSERT INTO children (parent, child, retain_until_ms)
            VALUES (p_parents[i], p_children[i], p_retain[i]) ON CONFLICT DO NOTHING;
        IF FOUND THEN
            UPDATE child_sets SET child_count = child_count + 1 WHERE parent = p_parents[i];
        END IF;
    END LOOP;
    INSERT INTO consumed_nonces (nonce, retain_until_ms) VALUES (p_nonce, p_nonce_retain)
        ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        RETURN -2;
    END IF;
    RETURN -1;
END
$fn$;

CREATE FUNCTION countersign_collect(p_now bigint, p_limit integer) RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE
    removed integer;
    gone integer;
    v_parents text[];
    v_children text[];
    v_gone text[];
BEGIN
    DELETE FROM consumed_nonces WHERE nonce IN (
        SELECT nonce FROM consumed_nonces WHERE retain_until_ms < p_now
        ORDER BY retain_until_ms LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS removed = ROW_COUNT;
    IF removed >= p_limit THEN
        RETURN removed;
    END IF;
    SELECT array_agg(v.parent), array_agg(v.child) INTO v_parents, v_children FROM (
        SELECT parent, child FROM children WHERE retain_until_ms < p_now
        ORDER BY retain_until_ms LIMIT p_limit - removed) AS v;
    IF v_parents IS NOT NULL THEN
        -- Same lock order as countersign_admit (parents sorted, before any child row), so the
        -- collector never deadlocks with an admit.
        PERFORM 1 FROM child_sets WHERE parent = ANY (v_parents) ORDER BY parent FOR UPDATE;
        WITH d AS (
            DELETE FROM children AS c USING unnest(v_parents, v_children) AS v(parent, child)
            WHERE c.parent = v.parent AND c.child = v.child AND c.retain_until_ms < p_now
            RETURNING c.parent)
        SELECT array_agg(d.parent) INTO v_gone FROM d;
        gone := coalesce(cardinality(v_gone), 0);
        IF gone > 0 THEN
            UPDATE child_sets AS s SET child_count = s.child_count - g.k
            FROM (SELECT parent, count(*)::integer AS k FROM unnest(v_gone) AS parent GROUP BY parent) AS g
            WHERE s.parent = g.parent;
        END IF;
        removed := removed + gone;
    END IF;
    -- Counter rows of parents with no child left and past retention: not entries, just tidying.
    DELETE FROM child_sets WHERE parent IN (
        SELECT parent FROM child_sets WHERE child_count = 0 AND retain_until_ms < p_now
        LIMIT p_limit FOR UPDATE SKIP LOCKED);
    RETURN removed;
END
$fn$;
