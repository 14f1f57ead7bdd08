-- The watermark mode on Kafka (watermark.go, docs/kafka.md): one row per
-- (consumer group, topic, partition), updated in the handler's transaction,
-- instead of a record per message. next_offset is the watermark, the next
-- offset to process: a message below it is a duplicate. last_* describe the
-- last message that committed or cached a failure, whose outcome (its
-- produced messages, or its failure) a redelivery replays: only that message
-- can have its produced messages unpublished. attempt_offset and attempts
-- count the failed attempts of the offset at the watermark across
-- deliveries. The table has as many rows as partitions and never grows with
-- the messages; its rows are updated in place (HOT: no indexed column
-- changes). fillfactor 10, the least there is, puts at most a few rows on a
-- page, and leaves the rest of it for their new versions: the handlers of
-- different partitions then seldom update the same page, and a page is
-- seldom too full, or too busy, to prune before the next update.
CREATE TABLE IF NOT EXISTS {{WATERMARKS}} (
	group_id           text NOT NULL,
	topic              text NOT NULL,
	partition          integer NOT NULL,
	next_offset        bigint NOT NULL,
	last_offset        bigint NOT NULL,
	last_status        smallint NOT NULL,
	last_result        bytea,
	last_error_kind    text,
	last_error_message text,
	last_message_uuid  text NOT NULL DEFAULT '',
	attempt_offset     bigint NOT NULL,
	attempts           integer NOT NULL,
	token              bigint NOT NULL,
	duplicate          boolean NOT NULL DEFAULT false,
	updated_at         timestamptz NOT NULL,
	PRIMARY KEY (group_id, topic, partition)
) WITH (fillfactor = 10);

COMMENT ON TABLE {{WATERMARKS}} IS 'oncemill: the Kafka watermark mode, one row per consumer group, topic and partition';
COMMENT ON COLUMN {{WATERMARKS}}.next_offset IS 'the watermark: the next offset to process; lower offsets are duplicates';
COMMENT ON COLUMN {{WATERMARKS}}.duplicate IS 'scratch: set by a claim to tell a duplicate from an execution; meaningless once committed';
