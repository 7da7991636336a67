-- Version 6: a retried session says so (docs/spec.md 17.5): when every receipt's nonce was consumed before
-- under the request id, accepted is the latest of their acceptance times (else NULL).
-- Applied by countersign/_daemon/postgres.py (PostgresDatabase.migrate) with search_path set to the
-- verifier's schema: nothing here names a schema, and each function pins it (SET search_path FROM CURRENT).
-- Released migrations are never edited: a change is a new file (docs/stores.md, Migration policy).

DROP FUNCTION countersign_admit_session(text[], text[], integer[], bigint[], text[], bigint[], boolean, text, bigint);

CREATE FUNCTION countersign_admit_session(
    p_parents text[], p_children text[], p_max integer[], p_retain bigint[],
    p_nonces text[], p_nonce_retain bigint[], p_consume boolean, p_request_id text, p_now bigint,
    OUT code integer, OUT accepted bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
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
    BEGIN
        FOR i IN 1 .. n LOOP
            INSERT INTO children (parent, child, retain_until_ms)
                VALUES (p_parents[i], p_children[i], p_retain[i]) ON CONFLICT DO NOTHING;
            IF FOUND THEN
                UPDATE child_sets SET child_count = child_count + 1 WHERE parent = p_parents[i];
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
            INSERT INTO consumed_nonces (nonce, retain_until_ms, request_id, accepted_ms)
                VALUES (p_nonces[k], p_nonce_retain[k], p_request_id, p_now) ON CONFLICT DO NOTHING;
            IF NOT FOUND THEN
                SELECT c.accepted_ms INTO earlier FROM consumed_nonces AS c
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
$fn$;
