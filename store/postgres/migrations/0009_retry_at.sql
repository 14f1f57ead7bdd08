-- retry_at holds a retryable row's next attempt back (store.Completion
-- RetryAfter, written by Release and RecordRollback from now() of the
-- database): until then a claim answers Held with the time left, and is no
-- attempt; a claim that executes clears it. NULL: nothing holds the row
-- back. Nullable without a default, the column is a change of the catalog
-- only: no row is rewritten. On a table of the partitioned layout it is
-- added to every partition.
ALTER TABLE {{TABLE}} ADD COLUMN IF NOT EXISTS retry_at timestamptz;

COMMENT ON COLUMN {{TABLE}}.retry_at IS 'for status 4, when the next attempt may start; NULL when nothing holds it back';
