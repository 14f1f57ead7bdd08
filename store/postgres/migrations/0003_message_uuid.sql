-- The message UUID of the delivery that last claimed the row, for an
-- operator who holds a message (dead-lettered, say) and looks for its
-- record whatever its key ("oncemill inspect --uuid"). Not indexed: an
-- index would cost every claim an insert into it, and the lookup is an
-- operator's, so it reads the table. A constant default makes the column
-- a change of the catalog only: existing rows are not rewritten.
ALTER TABLE {{TABLE}} ADD COLUMN IF NOT EXISTS message_uuid text NOT NULL DEFAULT '';

COMMENT ON COLUMN {{TABLE}}.message_uuid IS 'UUID of the message whose delivery last claimed the row; empty when unknown';
