-- The partitioned layout (Options.Layout): a new table
-- with the columns of schema version 3, partitioned by claimed_at, the time
-- of the claim that last put the row in its partition. Recorded as version
-- 3: later migrations apply to both layouts.
--
-- A unique index on a partitioned table must include the partition key, so
-- the table itself has no index: each partition has a unique index on
-- (scope, key), which keeps a key to one row within it, and one row per
-- (scope, key) across partitions comes from the claims, which take the
-- key's advisory lock and look the key up in the other partitions before
-- they write (version 6; sql_partitioned.go). No purge_at index: whole
-- partitions are dropped (docs/stores.md, "Partitioned layout"). The
-- partitions themselves are created by the store (Migrate, the background
-- cleaner, and a claim that finds none for now), with fillfactor 80 and
-- their unique index. No CHECK constraints (migration 7): a table of the
-- DELETE layout converted after migration 7 has none, and ATTACH wants
-- every CHECK constraint of the table on the partition.
CREATE SEQUENCE IF NOT EXISTS {{SEQ}} AS bigint CACHE 100;

CREATE TABLE IF NOT EXISTS {{TABLE}} (
	scope            text COLLATE "C" NOT NULL,
	key              text COLLATE "C" NOT NULL,
	fingerprint      text NOT NULL DEFAULT '',
	status           smallint NOT NULL,
	token            bigint NOT NULL,
	attempt          integer NOT NULL,
	taken_over       boolean NOT NULL DEFAULT false,
	result           bytea,
	error_kind       text,
	error_message    text,
	created_at       timestamptz NOT NULL,
	updated_at       timestamptz NOT NULL,
	expires_at       timestamptz NOT NULL,
	purge_at         timestamptz NOT NULL,
	message_uuid     text NOT NULL DEFAULT '',
	claimed_at       timestamptz NOT NULL
) PARTITION BY RANGE (claimed_at);

ALTER SEQUENCE {{SEQ}} OWNED BY {{TABLE}}.token;

COMMENT ON TABLE {{TABLE}} IS 'oncemill idempotency records, partitioned by claimed_at; see docs/stores.md';
COMMENT ON COLUMN {{TABLE}}.status IS '1 in_progress, 2 succeeded, 3 failed, 4 retryable';
COMMENT ON COLUMN {{TABLE}}.token IS 'fencing token from the table''s sequence; rises on every execution';
COMMENT ON COLUMN {{TABLE}}.expires_at IS 'when the row stops being visible; for status 1 the lease expiry';
COMMENT ON COLUMN {{TABLE}}.purge_at IS 'when the row may go, once expired; its partition is dropped when every row may';
COMMENT ON COLUMN {{TABLE}}.claimed_at IS 'partition key: when a claim last put the row in its partition';
