-- Converts a table of the DELETE layout (schema version 3) to the
-- partitioned layout, in Migrate's transaction: the old table becomes the
-- partition FROM (MINVALUE) TO ({{BOUND}}) of a new partitioned table of the
-- same name, dropped whole by the upkeep once its last row may go. No row is
-- copied. {{BOUND}} is the conversion's time: every old row gets it as its
-- claimed_at through a constant default (a change of the catalog, no
-- rewrite); a claim that takes one of them later moves it to the current
-- partition. Building the new primary key and checking the range read the
-- old table once, under Migrate's lock.
ALTER TABLE {{TABLE}} RENAME TO {{OLD_NAME}};
-- The token sequence must outlive the old table, which is dropped one day.
ALTER SEQUENCE {{SEQ}} OWNED BY NONE;
ALTER TABLE {{OLD}} ADD COLUMN claimed_at timestamptz NOT NULL DEFAULT {{BOUND_BEFORE}};
ALTER TABLE {{OLD}} DROP CONSTRAINT {{PKEY}};
DROP INDEX IF EXISTS {{SCHEMA}}.{{PURGE_INDEX}};
ALTER TABLE {{OLD}} ADD PRIMARY KEY (scope, key, claimed_at);
ALTER TABLE {{OLD}} ADD CONSTRAINT {{RANGE_CHECK}} CHECK (claimed_at < {{BOUND}});
