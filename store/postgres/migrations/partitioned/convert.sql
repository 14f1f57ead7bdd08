-- The last step of converting a table of the DELETE layout (schema version
-- 3) to the partitioned layout, in one short transaction under Migrate's
-- lock: the old table becomes the partition FROM (MINVALUE) TO ({{BOUND}})
-- of a new partitioned table of the same name, dropped whole by the upkeep
-- once its last row may go. No row is copied, and nothing here reads the
-- table: Store.Migrate has already, online, added claimed_at with a
-- constant default (a change of the catalog) and validated the range as a
-- CHECK constraint, which lets ATTACH skip its scan. The old table keeps
-- its primary key (scope, key): the unique index a partition has
-- (migration 6).
ALTER TABLE {{TABLE}} RENAME TO {{OLD_NAME}};
-- The token sequence must outlive the old table, which is dropped one day.
ALTER SEQUENCE {{SEQ}} OWNED BY NONE;
DROP INDEX IF EXISTS {{SCHEMA}}.{{PURGE_INDEX}};
