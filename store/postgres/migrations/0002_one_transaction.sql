-- The one-transaction layout.
--
-- expires_at is the only expiry: for an in-progress row it is the lease's.
-- purge_at, written when a row is claimed and left alone by completion,
-- extension and release, is when cleanup may remove the row (once it has
-- also expired). Only the primary key and purge_at are indexed, so that a
-- completion, an extension or a release changes no indexed column and is a
-- HOT update; fillfactor leaves room on each page for those new versions.
ALTER TABLE {{TABLE}} ADD COLUMN IF NOT EXISTS purge_at timestamptz;
UPDATE {{TABLE}} SET purge_at = expires_at WHERE purge_at IS NULL;
ALTER TABLE {{TABLE}} ALTER COLUMN purge_at SET NOT NULL;
ALTER TABLE {{TABLE}} DROP COLUMN IF EXISTS lease_expires_at;
DROP INDEX IF EXISTS {{SCHEMA}}.{{INDEX}};
CREATE INDEX IF NOT EXISTS {{PURGE_INDEX}} ON {{TABLE}} (purge_at);
ALTER TABLE {{TABLE}} SET (fillfactor = 80);
-- Each backend takes tokens 100 at a time: one shared sequence page locked
-- by every claim was the costliest part of a claim under concurrency. Tokens
-- still rise for a key: a claim of an existing row takes the greater of its
-- sequence value and the row's token + 1.
ALTER SEQUENCE {{SEQ}} CACHE 100;

COMMENT ON COLUMN {{TABLE}}.expires_at IS 'when the row stops being visible; for status 1 the lease expiry';
COMMENT ON COLUMN {{TABLE}}.purge_at IS 'when cleanup may remove the row, once expired; set when the row is claimed';
