-- oncemill records: one row per (scope, key).
--
-- status: 1 in_progress, 2 succeeded, 3 failed, 4 retryable (store.Status).
-- expires_at is when the row stops being visible; for an in-progress row it
-- equals lease_expires_at. Every time is set from now() of the database.
CREATE SEQUENCE IF NOT EXISTS {{SEQ}} AS bigint;

CREATE TABLE IF NOT EXISTS {{TABLE}} (
	scope            text COLLATE "C" NOT NULL,
	key              text COLLATE "C" NOT NULL,
	fingerprint      text NOT NULL DEFAULT '',
	status           smallint NOT NULL CHECK (status BETWEEN 1 AND 4),
	token            bigint NOT NULL,
	attempt          integer NOT NULL CHECK (attempt > 0),
	taken_over       boolean NOT NULL DEFAULT false,
	lease_expires_at timestamptz,
	result           bytea,
	error_kind       text,
	error_message    text,
	created_at       timestamptz NOT NULL,
	updated_at       timestamptz NOT NULL,
	expires_at       timestamptz NOT NULL,
	PRIMARY KEY (scope, key)
);

-- Serves cleanup (oldest expired first) and the cleanup lag metric.
CREATE INDEX IF NOT EXISTS {{INDEX}} ON {{TABLE}} (expires_at);

ALTER SEQUENCE {{SEQ}} OWNED BY {{TABLE}}.token;

COMMENT ON TABLE {{TABLE}} IS 'oncemill idempotency records; see docs/stores.md';
COMMENT ON COLUMN {{TABLE}}.status IS '1 in_progress, 2 succeeded, 3 failed, 4 retryable';
COMMENT ON COLUMN {{TABLE}}.token IS 'fencing token from the table''s sequence; rises on every execution';
COMMENT ON COLUMN {{TABLE}}.taken_over IS 'the current lease took over an expired one';
