-- Version 4: when each nonce was consumed, so that a retry's answer names the acceptance it repeats (0 for
-- nonces consumed before); countersign_admit takes the time and answers it with code -3.
-- Applied by countersign/_daemon/postgres.py (PostgresDatabase.migrate) with search_path set to the
-- verifier's schema: nothing here names a schema, and each function pins it (SET search_path FROM CURRENT).
-- Released migrations are never edited: a change is a new file (docs/stores.md, Migration policy).

ALTER TABLE consumed_nonces ADD COLUMN accepted_ms bigint NOT NULL DEFAULT 0;
DROP FUNCTION countersign_admit(text[], text[], integer[], bigint[], text, bigint, boolean, text);

CREATE FUNCTION countersign_admit(
    p_parents text[], p_children text[], p_max integer[], p_retain bigint[],
    p_nonce text, p_nonce_retain bigint, p_consume boolean, p_request_id text, p_now bigint,
    OUT code integer, OUT accepted bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE
    n integer := coalesce(array_length(p_parents, 1), 0);
    held integer;
BEGIN
    IF p_consume AND n > 0 THEN
        INSERT INTO child_sets AS s (parent, child_count, retain_until_ms)
            SELECT e.parent, 0, max(e.retain) FROM unnest(p_parents, p_retain) AS e(parent, retain)
            GROUP BY e.parent ORDER BY e.parent
        ON CONFLICT (parent) DO UPDATE
            SET retain_until_ms = greatest(s.retain_until_ms, EXCLUDED.retain_until_ms);
    END IF;
    FOR i IN 1 .. n LOOP
        PERFORM 1 FROM children WHERE parent = p_parents[i] AND child = p_children[i];
        IF NOT FOUND THEN
            held := NULL;
            SELECT child_count INTO held FROM child_sets WHERE parent = p_parents[i];
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
        INSERT INTO children (parent, child, retain_until_ms)
            VALUES (p_parents[i], p_children[i], p_retain[i]) ON CONFLICT DO NOTHING;
        IF FOUND THEN
            UPDATE child_sets SET child_count = child_count + 1 WHERE parent = p_parents[i];
        END IF;
    END LOOP;
    INSERT INTO consumed_nonces (nonce, retain_until_ms, request_id, accepted_ms)
        VALUES (p_nonce, p_nonce_retain, p_request_id, p_now) ON CONFLICT DO NOTHING;
    IF NOT FOUND THEN
        IF p_request_id <> '' THEN
            SELECT c.accepted_ms INTO accepted FROM consumed_nonces AS c
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
$fn$;
