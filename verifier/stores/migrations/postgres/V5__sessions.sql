-- Version 5: sessions (docs/spec.md 17.5), the agent path's edges and every receipt's nonce in one
-- statement, all or nothing. The writes run in a block whose exception handler undoes them (a
-- subtransaction), so a nonce found consumed leaves nothing behind. Nonces are inserted in sorted order,
-- so two admissions sharing nonces queue on the rows instead of deadlocking.
-- Applied by countersign/_daemon/postgres.py (PostgresDatabase.migrate) with search_path set to the
-- verifier's schema: nothing here names a schema, and each function pins it (SET search_path FROM CURRENT).
-- Released migrations are never edited: a change is a new file (docs/stores.md, Migration policy).

CREATE FUNCTION countersign_admit_session(
    p_parents text[], p_children text[], p_max integer[], p_retain bigint[],
    p_nonces text[], p_nonce_retain bigint[], p_consume boolean, p_request_id text, p_now bigint)
    RETURNS integer
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE
    n integer := coalesce(array_length(p_parents, 1), 0);
    held integer;
    k integer;
    previous text := NULL;
    replayed integer := NULL;
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
                RETURN i - 1;
            END IF;
        END IF;
    END LOOP;
    IF NOT p_consume THEN
        RETURN -1;
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
                PERFORM 1 FROM consumed_nonces
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
$fn$;
