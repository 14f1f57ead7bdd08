-- The records table keeps no CHECK constraints on status and attempt.
-- PostgreSQL rebuilds a table's CHECK expressions from their stored text,
-- parsing and planning them, in every statement that inserts or updates a
-- row (docs/benchmarks.md, "The deferred claim as a plain insert"), which
-- every claim paid for; the store writes both columns from its own
-- constants and counters. The table's constraints go first (on a
-- partitioned table, with the copies its partitions inherited), then the
-- ones a partition holds as its own, as the first partition of a converted
-- table does.
DO $oncemill$
DECLARE
	c record;
BEGIN
	FOR c IN
		SELECT k.conrelid::regclass AS rel, k.conname
		FROM pg_constraint k
		WHERE k.contype = 'c'
			AND (k.conrelid = to_regclass('{{TABLE}}')
				OR k.conrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass('{{TABLE}}')))
			AND (SELECT array_agg(a.attname::text) FROM pg_attribute a
				WHERE a.attrelid = k.conrelid AND a.attnum = ANY (k.conkey)) IN (ARRAY['status'], ARRAY['attempt'])
		ORDER BY k.conrelid <> to_regclass('{{TABLE}}')
	LOOP
		-- IF EXISTS: the table's own drop took the inherited copies already.
		EXECUTE format('ALTER TABLE %s DROP CONSTRAINT IF EXISTS %I', c.rel, c.conname);
	END LOOP;
END
$oncemill$;
