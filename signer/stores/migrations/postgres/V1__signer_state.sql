-- The signer's state (docs/stores.md "Signer state"): every replica of one deployer shares this schema.
-- Applied by countersign/_daemon/postgres.py with search_path set to the schema.

CREATE TABLE issued (
    digest text PRIMARY KEY,
    path bytea NOT NULL,
    expires_ms bigint NOT NULL
);
CREATE INDEX issued_expiry ON issued (expires_ms);

-- One row per parent that has children: the row a new child locks and counts on.
CREATE TABLE child_counts (
    parent text PRIMARY KEY,
    count integer NOT NULL CHECK (count >= 0),
    expires_ms bigint NOT NULL
);
CREATE INDEX child_counts_expiry ON child_counts (expires_ms);

CREATE TABLE children (
    parent text NOT NULL,
    child_nonce text NOT NULL,
    PRIMARY KEY (parent, child_nonce)
);

CREATE TABLE grants (
    grant_id text PRIMARY KEY,
    parent text NOT NULL,
    child_deployer text NOT NULL,
    expires_ms bigint NOT NULL,
    manifest_digest text,
    parent_cosig text
);
CREATE INDEX grants_expiry ON grants (expires_ms);

CREATE TABLE agent_sessions (
    agent text NOT NULL,
    session text NOT NULL,
    seq bigint NOT NULL,
    last_digest text NOT NULL,
    closed boolean NOT NULL,
    stream_unit text,
    stream_n integer,
    expires_ms bigint NOT NULL,
    PRIMARY KEY (agent, session)
);
CREATE INDEX agent_sessions_expiry ON agent_sessions (expires_ms);

CREATE TABLE proposals (
    grant_id text PRIMARY KEY,
    parent text NOT NULL,
    child_record bytea NOT NULL,
    child_cosig text NOT NULL,
    expires_ms bigint NOT NULL,
    sealed_path bytea
);
CREATE INDEX proposals_expiry ON proposals (expires_ms);

CREATE TABLE requests (
    request_id text PRIMARY KEY,
    fingerprint text NOT NULL,
    answer bytea NOT NULL,
    expires_ms bigint NOT NULL,
    record text NOT NULL DEFAULT ''  -- the issued record whose path the answer carries (kept there, not here)
);
CREATE INDEX requests_expiry ON requests (expires_ms);

-- Everything one signing call reads, in one round trip and one snapshot; a column is null where
-- nothing is stored (or nothing was asked: a null key matches no row).
CREATE FUNCTION signer_read(
    k_issued text, k_parent text, k_agent text, k_session text, k_grant text, k_proposal text, k_request text)
RETURNS TABLE (
    issued_path bytea, child_count integer,
    s_seq bigint, s_last text, s_closed boolean, s_unit text, s_n integer,
    g_parent text, g_child text, g_expires bigint, g_manifest text, g_cosig text,
    p_parent text, p_record bytea, p_cosig text, p_expires bigint, p_sealed bytea,
    r_fingerprint text, r_answer bytea, r_expires bigint, r_record text)
LANGUAGE sql STABLE SET search_path FROM CURRENT AS $fn$
SELECT i.path, c.count,
       s.seq, s.last_digest, s.closed, s.stream_unit, s.stream_n,
       g.parent, g.child_deployer, g.expires_ms, g.manifest_digest, g.parent_cosig,
       p.parent, p.child_record, p.child_cosig, p.expires_ms, p.sealed_path,
       r.fingerprint, r.answer, r.expires_ms, r.record
FROM (SELECT 1) AS one
LEFT JOIN issued i ON i.digest = k_issued
LEFT JOIN child_counts c ON c.parent = k_parent
LEFT JOIN agent_sessions s ON s.agent = k_agent AND s.session = k_session
LEFT JOIN grants g ON g.grant_id = k_grant
LEFT JOIN proposals p ON p.grant_id = k_proposal
LEFT JOIN requests r ON r.request_id = k_request
$fn$;

-- One conditional write (countersign/signer_state.py StateWrite, as JSON; byte strings in base64).
-- Answers false as soon as a condition fails; the caller then rolls back what this call did. Every
-- condition holds against the state before the write: a grant is spent (a proposal sealed) before a
-- new one of the same id is inserted, so a write naming both finds it missing, as the reference does.
-- Every condition is a single statement on the row it guards (an insert that must be new, an update
-- of the row as it was read), so concurrent writers queue on that row and the second one finds it
-- changed: two replicas cannot both spend one grant, slot or seq.
CREATE FUNCTION signer_apply_one(w jsonb) RETURNS boolean
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE
    r jsonb;
BEGIN
    IF w ? 'request' THEN
        r := w -> 'request';
        INSERT INTO requests (request_id, fingerprint, answer, expires_ms, record)
            VALUES (r ->> 'request_id', r ->> 'fingerprint', decode(r ->> 'answer', 'base64'),
                    (r ->> 'expires_ms')::bigint, r ->> 'record')
            ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN RETURN false; END IF;
    END IF;
    IF w ? 'session' THEN
        r := w -> 'session';
        IF jsonb_typeof(r -> 'previous_seq') = 'null' THEN
            INSERT INTO agent_sessions (agent, session, seq, last_digest, closed, stream_unit, stream_n, expires_ms)
                VALUES (r ->> 'agent', r ->> 'session', (r ->> 'seq')::bigint, r ->> 'last_digest',
                        (r ->> 'closed')::boolean, r ->> 'stream_unit', (r ->> 'stream_n')::integer,
                        (r ->> 'expires_ms')::bigint)
                ON CONFLICT DO NOTHING;
        ELSE
            UPDATE agent_sessions
                SET seq = (r ->> 'seq')::bigint, last_digest = r ->> 'last_digest', closed = (r ->> 'closed')::boolean,
                    stream_unit = r ->> 'stream_unit', stream_n = (r ->> 'stream_n')::integer,
                    expires_ms = greatest(expires_ms, (r ->> 'expires_ms')::bigint)
                WHERE agent = r ->> 'agent' AND session = r ->> 'session' AND seq = (r ->> 'previous_seq')::bigint;
        END IF;
        IF NOT FOUND THEN RETURN false; END IF;
    END IF;
    IF w ? 'child' THEN
        r := w -> 'child';
        INSERT INTO child_counts (parent, count, expires_ms) VALUES (r ->> 'parent', 0, (r ->> 'expires_ms')::bigint)
            ON CONFLICT DO NOTHING;
        UPDATE child_counts SET count = count + 1, expires_ms = greatest(expires_ms, (r ->> 'expires_ms')::bigint)
            WHERE parent = r ->> 'parent' AND count < (r ->> 'max_children')::integer;
        IF NOT FOUND THEN RETURN false; END IF;
        INSERT INTO children (parent, child_nonce) VALUES (r ->> 'parent', r ->> 'nonce') ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN RETURN false; END IF;
    END IF;
    IF w ? 'spend' THEN
        r := w -> 'spend';
        UPDATE grants SET manifest_digest = r ->> 'manifest_digest', parent_cosig = r ->> 'parent_cosig'
            WHERE grant_id = r ->> 'grant_id' AND manifest_digest IS NULL;
        IF NOT FOUND THEN RETURN false; END IF;
    END IF;
    IF w ? 'new_grant' THEN
        r := w -> 'new_grant';
        INSERT INTO grants (grant_id, parent, child_deployer, expires_ms)
            VALUES (r ->> 'grant_id', r ->> 'parent', r ->> 'child_deployer', (r ->> 'expires_ms')::bigint)
            ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN RETURN false; END IF;
    END IF;
    IF w ? 'seal' THEN
        r := w -> 'seal';
        UPDATE proposals SET sealed_path = decode(r ->> 'path', 'base64')
            WHERE grant_id = r ->> 'grant_id' AND sealed_path IS NULL;
        IF NOT FOUND THEN RETURN false; END IF;
    END IF;
    IF w ? 'proposal' THEN
        r := w -> 'proposal';
        INSERT INTO proposals (grant_id, parent, child_record, child_cosig, expires_ms)
            VALUES (r ->> 'grant_id', r ->> 'parent', decode(r ->> 'child_record', 'base64'), r ->> 'child_cosig',
                    (r ->> 'expires_ms')::bigint)
            ON CONFLICT DO NOTHING;
        IF NOT FOUND THEN RETURN false; END IF;
    END IF;
    FOR r IN SELECT value FROM jsonb_array_elements(coalesce(w -> 'issued', '[]'::jsonb)) LOOP
        INSERT INTO issued (digest, path, expires_ms)
            VALUES (r ->> 'digest', decode(r ->> 'path', 'base64'), (r ->> 'expires_ms')::bigint)
            ON CONFLICT DO NOTHING;
    END LOOP;
    RETURN true;
END
$fn$;

-- A batch of writes (the signer's group commit) in one statement and one transaction: each write in
-- its own subtransaction, rolled back whole when a condition fails. One result per write, in order.
CREATE FUNCTION signer_apply(p_writes jsonb) RETURNS boolean[]
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE
    w jsonb;
    results boolean[] := ARRAY[]::boolean[];
BEGIN
    FOR w IN SELECT e.value FROM jsonb_array_elements(p_writes) WITH ORDINALITY AS e(value, n) ORDER BY e.n LOOP
        BEGIN
            IF NOT signer_apply_one(w) THEN
                RAISE EXCEPTION 'condition failed' USING ERRCODE = 'CS001';
            END IF;
            results := results || true;
        EXCEPTION WHEN SQLSTATE 'CS001' THEN
            results := results || false;
        END;
    END LOOP;
    RETURN results;
END
$fn$;

-- Forget at most p_limit expired rows of each table; a parent's children go with its count row.
-- SKIP LOCKED: replicas collect concurrently without waiting on each other or on a live write.
CREATE FUNCTION signer_collect(p_cutoff bigint, p_limit integer) RETURNS TABLE (tbl text, removed bigint)
LANGUAGE plpgsql SET search_path FROM CURRENT AS $fn$
DECLARE
    parents text[];
    n bigint;
BEGIN
    SELECT coalesce(array_agg(parent), ARRAY[]::text[]) INTO parents FROM (
        SELECT parent FROM child_counts WHERE expires_ms < p_cutoff LIMIT p_limit FOR UPDATE SKIP LOCKED) AS x;
    DELETE FROM children WHERE parent = ANY(parents);
    GET DIAGNOSTICS n = ROW_COUNT; tbl := 'children'; removed := n; RETURN NEXT;
    DELETE FROM child_counts WHERE parent = ANY(parents);
    GET DIAGNOSTICS n = ROW_COUNT; tbl := 'child_counts'; removed := n; RETURN NEXT;
    DELETE FROM issued WHERE digest IN (
        SELECT digest FROM issued WHERE expires_ms < p_cutoff LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT; tbl := 'issued'; removed := n; RETURN NEXT;
    DELETE FROM agent_sessions WHERE (agent, session) IN (
        SELECT agent, session FROM agent_sessions WHERE expires_ms < p_cutoff LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT; tbl := 'agent_sessions'; removed := n; RETURN NEXT;
    DELETE FROM grants WHERE grant_id IN (
        SELECT grant_id FROM grants WHERE expires_ms < p_cutoff LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT; tbl := 'grants'; removed := n; RETURN NEXT;
    DELETE FROM proposals WHERE grant_id IN (
        SELECT grant_id FROM proposals WHERE expires_ms < p_cutoff LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT; tbl := 'proposals'; removed := n; RETURN NEXT;
    DELETE FROM requests WHERE request_id IN (
        SELECT request_id FROM requests WHERE expires_ms < p_cutoff LIMIT p_limit FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS n = ROW_COUNT; tbl := 'requests'; removed := n; RETURN NEXT;
END
$fn$;
