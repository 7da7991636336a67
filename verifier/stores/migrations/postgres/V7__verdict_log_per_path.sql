-- Version 7 (issue 29): the verdict log storing what repeats once per client identity
-- (verifier/stores/verdict_rows.py). The verdicts of versions 3-6 are moved over by PostgresState after
-- this file runs, by the same code that records verdicts (a path's digest is the SHA-256 of its records'
-- JSON as Python writes it), and the old tables dropped, in one transaction under the migration lock.
-- Applied by countersign/_daemon/postgres.py (PostgresDatabase.migrate) with search_path set to the
-- verifier's schema: nothing here names a schema, and each function pins it (SET search_path FROM CURRENT).
-- Released migrations are never edited: a change is a new file (docs/stores.md, Migration policy).

CREATE TABLE verdict_log (
    verdict_id text NOT NULL UNIQUE,
    time_ms bigint NOT NULL,
    mode text NOT NULL,
    client text NOT NULL,
    request_id text NOT NULL,
    registry_sequence bigint NOT NULL,
    verdict text NOT NULL,
    reason text NOT NULL,
    path_digest bytea,
    retain_until_ms bigint NOT NULL,
    needs_revalidation boolean NOT NULL DEFAULT false,
    revalidation_cause text NOT NULL DEFAULT '',
    bytes integer NOT NULL,
    marked_ms bigint
);
CREATE INDEX verdict_log_by_path ON verdict_log (client, path_digest, time_ms);
CREATE INDEX verdict_log_by_client ON verdict_log (client, time_ms, verdict_id);
CREATE INDEX verdict_log_retention ON verdict_log (retain_until_ms);

CREATE TABLE verdict_paths (
    client text NOT NULL,
    path_digest bytea NOT NULL,
    construction text NOT NULL,
    records text NOT NULL,
    bytes integer NOT NULL,
    PRIMARY KEY (client, path_digest)
);

CREATE TABLE verdict_path_uses (
    kind text NOT NULL,
    value text NOT NULL,
    client text NOT NULL,
    path_digest bytea NOT NULL,
    PRIMARY KEY (kind, value, client, path_digest)
);
