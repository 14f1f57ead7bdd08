-- contended is scratch, as duplicate is: set by a watermark claim that
-- waited for another owner's transaction on the row (watermark.go,
-- wmContended), and returned to it; meaningless once committed.
ALTER TABLE {{WATERMARKS}} ADD COLUMN IF NOT EXISTS contended boolean NOT NULL DEFAULT false;
