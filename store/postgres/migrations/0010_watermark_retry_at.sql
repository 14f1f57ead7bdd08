-- retry_at holds the next attempt of the offset whose attempts a watermark
-- row counts (attempt_offset) back (store.Completion.RetryAfter, written
-- by RecordRollback from now() of the database): until then a claim of that
-- offset answers Held with the time left, and is no attempt; a claim that
-- executes clears it, and it means nothing for any other offset
-- (internal/watermark, wmHeld). NULL: nothing holds the partition back.
-- Nullable without a default, the column is a change of the catalog only.
ALTER TABLE {{WATERMARKS}} ADD COLUMN IF NOT EXISTS retry_at timestamptz;

COMMENT ON COLUMN {{WATERMARKS}}.retry_at IS 'when the next attempt of attempt_offset may start; NULL when nothing holds it back';
