-- What the checkpoint names, so a coordinator replica replaces the stored checkpoint only with one that
-- is not older (spec 7.5): two replicas never put an older checkpoint over a newer one.
ALTER TABLE registry_checkpoint ADD COLUMN IF NOT EXISTS sequence bigint NOT NULL DEFAULT 0;
ALTER TABLE registry_checkpoint ADD COLUMN IF NOT EXISTS issued_ms bigint NOT NULL DEFAULT 0;
