-- oncemill records: one row per (scope, key).
--
-- status: 1 in_progress, 2 succeeded, 3 failed, 4 retryable (store.Status).
-- Times are UTC, set from UTC_TIMESTAMP(6) of the server. expires_at is
-- when the row stops being visible (an in-progress row's lease expiry);
-- purge_at is when cleanup may remove it, once expired. scope and key are
-- bytes, compared and ordered as Go compares strings.
CREATE TABLE IF NOT EXISTS {{TABLE}} (
	scope         VARBINARY(1024) NOT NULL,
	`key`         VARBINARY(1024) NOT NULL,
	fingerprint   VARBINARY(255) NOT NULL DEFAULT '',
	status        TINYINT NOT NULL,
	token         BIGINT NOT NULL COMMENT 'fencing token; rises on every execution',
	attempt       INT NOT NULL,
	taken_over    BOOLEAN NOT NULL DEFAULT FALSE,
	result        LONGBLOB NULL,
	error_kind    VARBINARY(256) NOT NULL DEFAULT '',
	error_message BLOB NULL,
	message_uuid  VARBINARY(1024) NOT NULL DEFAULT '',
	created_at    DATETIME(6) NOT NULL,
	updated_at    DATETIME(6) NOT NULL,
	expires_at    DATETIME(6) NOT NULL,
	purge_at      DATETIME(6) NOT NULL,
	retry_at      DATETIME(6) NULL,
	PRIMARY KEY (scope, `key`),
	KEY {{PURGE_INDEX}} (purge_at)
) ENGINE=InnoDB ROW_FORMAT=DYNAMIC COMMENT='oncemill idempotency records; see docs/mysql.md';
