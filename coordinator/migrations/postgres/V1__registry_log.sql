-- The registry log (docs/stores.md "Registry log"): every coordinator replica shares this schema.
-- IF NOT EXISTS: a schema an earlier release made (without a version table) is adopted as it is.
CREATE TABLE IF NOT EXISTS registry_log (
    sequence bigint PRIMARY KEY,
    digest text NOT NULL,
    statement bytea NOT NULL
);
-- One row: only the latest checkpoint matters (an older one is superseded, never served).
CREATE TABLE IF NOT EXISTS registry_checkpoint (
    only_row integer PRIMARY KEY CHECK (only_row = 1),
    checkpoint bytea NOT NULL
);
