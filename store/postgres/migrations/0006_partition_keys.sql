-- The partitioned layout keys each partition by (scope, key) instead of
-- keying the whole table by (scope, key, claimed_at): a unique index of a
-- partition may leave the partition key out, and with it a claim of a new
-- key in the partition of now is one INSERT .. ON CONFLICT DO NOTHING, as
-- in the DELETE layout (sql_partitioned.go, sqlPartClaimNewCurrent). Every
-- partition without such an index gets one; then the table's primary key
-- (scope, key, claimed_at), and the index it put on every partition, goes.
-- A key has at most one row in the whole table already, so no index build
-- can fail on a duplicate. The DELETE layout's table is left as it is.
DO $oncemill$
DECLARE
	part regclass;
	pkey name;
BEGIN
	IF (SELECT relkind FROM pg_class WHERE oid = to_regclass('{{TABLE}}')) <> 'p' THEN
		RETURN;
	END IF;
	FOR part IN
		SELECT i.inhrelid::regclass FROM pg_inherits i
		WHERE i.inhparent = to_regclass('{{TABLE}}')
			AND NOT EXISTS (
				SELECT 1 FROM pg_index x
				WHERE x.indrelid = i.inhrelid AND x.indisunique AND x.indnkeyatts = 2
					AND x.indexprs IS NULL AND x.indpred IS NULL
					AND (SELECT array_agg(a.attname::text ORDER BY a.attname) FROM pg_attribute a
						WHERE a.attrelid = i.inhrelid AND a.attnum IN (x.indkey[0], x.indkey[1])) = ARRAY['key', 'scope'])
	LOOP
		EXECUTE format('CREATE UNIQUE INDEX ON %s (scope, key)', part);
	END LOOP;
	SELECT conname INTO pkey FROM pg_constraint WHERE conrelid = to_regclass('{{TABLE}}') AND contype = 'p';
	IF pkey IS NOT NULL THEN
		EXECUTE format('ALTER TABLE {{TABLE}} DROP CONSTRAINT %I', pkey);
	END IF;
END
$oncemill$;
