-- contended is scratch, as duplicate is: set by a claim that waited for
-- another owner's transaction on the row (watermark.go, wmContended), and
-- returned to it; meaningless once committed.
ALTER TABLE {{WATERMARKS}} ADD COLUMN IF NOT EXISTS contended boolean NOT NULL DEFAULT false;

-- The watermark mode's optimistic commit (watermark_fast.go): a process that
-- committed a partition's last message knows its watermark, and runs the
-- next message's handler without claiming first; the claim moves to the
-- commit, in the commit's round trip. This function advances the watermark
-- past offset p_offset and records the message as the last one, as a claim
-- and its commit do, if the watermark has not moved past the offset
-- meanwhile. If it has (another owner committed the offset: a rebalance, two
-- owners at once), it raises SQLSTATE OM001, which aborts the transaction
-- server-side: the COMMIT pipelined after it rolls the handler's writes
-- back, and the caller replays the offset's recorded outcome. It waits for
-- the row's lock like the claim, so that two owners are ordered here. It
-- returns the row's new token.
CREATE OR REPLACE FUNCTION {{WM_COMMIT}}(p_group text, p_topic text, p_partition integer, p_offset bigint,
	p_message_uuid text, p_result bytea) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
	new_token bigint;
BEGIN
	UPDATE {{WATERMARKS}} AS w SET
		next_offset = p_offset + 1,
		last_offset = p_offset,
		last_status = {{SUCCEEDED}},
		last_result = p_result,
		last_error_kind = NULL,
		last_error_message = NULL,
		last_message_uuid = p_message_uuid,
		attempts = CASE WHEN w.attempt_offset = p_offset THEN w.attempts + 1 ELSE 1 END,
		attempt_offset = p_offset,
		token = w.token + 1,
		duplicate = false,
		contended = false,
		updated_at = now()
	WHERE w.group_id = p_group AND w.topic = p_topic AND w.partition = p_partition AND w.next_offset <= p_offset
	RETURNING w.token INTO new_token;
	IF NOT FOUND THEN
		RAISE EXCEPTION 'oncemill: the watermark of group %, topic %, partition % moved past offset %', p_group, p_topic, p_partition, p_offset
			USING ERRCODE = 'OM001';
	END IF;
	RETURN new_token;
END
$$;

