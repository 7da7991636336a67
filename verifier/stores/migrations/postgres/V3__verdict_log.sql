-- Version 3: the verdict log as it was until version 7 (issue 29): one row per verdict, one per signature
-- its records carry, each with the verdict's time so "relied on K since T" is one range of one index.
-- Applied by countersign/_daemon/postgres.py (PostgresDatabase.migrate) with search_path set to the
-- verifier's schema: nothing here names a schema, and each function pins it (SET search_path FROM CURRENT).
-- Released migrations are never edited: a change is a new file (docs/stores.md, Migration policy).

CREATE TABLE verdicts (
    verdict_id text PRIMARY KEY,
    time_ms bigint NOT NULL,
    mode text NOT NULL,
    client text NOT NULL,
    request_id text NOT NULL,
    registry_sequence bigint NOT NULL,
    verdict text NOT NULL,
    reason text NOT NULL,
    construction text NOT NULL,
    retain_until_ms bigint NOT NULL,
    needs_revalidation boolean NOT NULL DEFAULT false,
    revalidation_cause text NOT NULL DEFAULT '',
    marked_ms bigint
);
CREATE INDEX verdicts_by_time ON verdicts (time_ms, verdict_id);
CREATE INDEX verdicts_retention ON verdicts (retain_until_ms);

CREATE TABLE verdict_signatures (
    verdict_id text NOT NULL REFERENCES verdicts (verdict_id) ON DELETE CASCADE,
    position integer NOT NULL,
    role text NOT NULL,
    record_digest text NOT NULL,
    deployer text NOT NULL,
    key_id text NOT NULL,
    created_ms bigint NOT NULL,
    time_ms bigint NOT NULL,
    PRIMARY KEY (verdict_id, position, role)
);
CREATE INDEX verdict_signatures_by_key ON verdict_signatures (key_id, time_ms);
CREATE INDEX verdict_signatures_by_record ON verdict_signatures (record_digest, time_ms);
CREATE INDEX verdict_signatures_by_deployer ON verdict_signatures (deployer, time_ms);
