package postgres

import "strings"

// The statements of the partitioned layout that differ
// from the DELETE layout's. A unique index of a partitioned table must
// include the partition key (claimed_at), so nothing in the table keeps
// (scope, key) unique: every statement that may create a row of a key runs
// after a statement that takes the key's advisory lock, in the same
// transaction, and looks the key up in every partition. The lookup runs in
// its own statement, after the lock is granted, so that its READ COMMITTED
// snapshot holds every row a previous holder of the lock committed (a lock
// taken inside the statement would come after the statement's snapshot).
// Each statement that looks a key up does so in the partitions from
// {{LOOKUP_FROM}} on, a constant of the statement's text (partClaims): the
// key filters (keyfilters.go) tell which closed partitions cannot hold the
// key, and a constant bound lets PostgreSQL leave them out of the plan,
// which then neither opens nor locks them, where a parameter would keep
// every partition in a cached generic plan.
// Get, List, Delete and the one-transaction commit are the DELETE
// layout's: they name the row by (scope, key, token), which matches one row
// in one partition. Complete, Release and Extend are too, for a row claimed
// within filterDelay; an older row they move (partMove).

// sqlReadCommitted holds in a transaction at read committed, which every
// claim of the one-transaction mode checks along with the key's lock: its
// BEGIN names no isolation while the server's default is read committed
// (Store.beginReadCommitted), and a lookup in a transaction at another level
// would see the snapshot of its first statement, taken before the lock. The
// claims in one statement do not need it, but check it too, so that every
// claim, not only the few that look a key up, finds a default that is not.
const sqlReadCommitted = `current_setting('transaction_isolation') = 'read committed'`

// notReadCommittedMarker is the text sqlPartLockTx fails to cast (SQLSTATE
// 22P02) in a transaction that is not at read committed.
const notReadCommittedMarker = "oncemill: the transaction of a claim is not at read committed"

// sqlPartLockLease takes the key's advisory lock ($1) for the claim that
// follows it in the same transaction (a batch: one round trip). The wait is
// bounded by the operation's context.
const sqlPartLockLease = `SELECT pg_advisory_xact_lock({{CLAIM_LOCK}}, $1){{ASYNC}}`

// sqlPartLockTx is the one-transaction claim's lock: it waits at most $1
// milliseconds (lock_timeout, put back to the session's value in the same
// statement) for the key's advisory lock ($2), which the claim then holds
// until its transaction ends.
const sqlPartLockTx = `
WITH p AS MATERIALIZED (SELECT current_setting('lock_timeout') AS prior, set_config('lock_timeout', ($1::int8)::text, true),
	(CASE WHEN ` + sqlReadCommitted + ` THEN '0' ELSE '` + notReadCommittedMarker + `' END)::int8 AS read_committed),
l AS MATERIALIZED (SELECT pg_advisory_xact_lock({{CLAIM_LOCK}}, $2) FROM p)
SELECT set_config('lock_timeout', p.prior, true), p.read_committed FROM p CROSS JOIN l`

// partLookup is the key's row (at most one, across every partition from
// {{LOOKUP_FROM}} on: partClaims), locked, with what a claim may do with it: take it afresh (free), carry
// its attempt count on (carry: the rules of sqlClaim, a held-back retryable
// row left out), and whether it was claimed filterDelay ago or more (aged,
// $W in microseconds: a claim that takes it moves it to the current
// partition, so that no write changes a row of a partition in place once
// the cleaner may have read it, partMove). $1 scope, $2 key, $3 fingerprint.
const partLookup = `o AS MATERIALIZED (
	SELECT t.*,
		(t.status <> {{IN_PROGRESS}} AND t.expires_at <= now()) AS free,
		(((t.status = {{IN_PROGRESS}} AND t.expires_at <= now())
				OR (t.status = {{RETRYABLE}} AND t.expires_at > now() AND (t.retry_at IS NULL OR t.retry_at <= now())))
			AND ($3::text = '' OR t.fingerprint = '' OR $3::text = t.fingerprint)) AS carry,
		t.claimed_at <= statement_timestamp() - $W::int8 * interval '1 microsecond' AS aged
	FROM {{TABLE}} t
	WHERE t.scope = $1::text AND t.key = $2::text AND t.claimed_at >= {{LOOKUP_FROM}}
	FOR UPDATE),
take AS (SELECT * FROM o WHERE free OR carry),
moved AS (
	DELETE FROM {{TABLE}} t USING take
	WHERE take.aged AND t.scope = take.scope AND t.key = take.key AND t.claimed_at = take.claimed_at AND t.claimed_at >= {{LOOKUP_FROM}}
	RETURNING take.*)`

// sqlPartClaimNew is the one-transaction claim's fast path, sent with BEGIN
// and sqlPartLockTx: a key with no row in any partition is inserted in the
// current partition in its final form, as sqlClaimNew does in the DELETE
// layout. It returns the token, or nothing when the key has a row; the
// claim then goes on with sqlPartClaim in the same transaction, under the
// lock it holds. A statement that only inserts is planned and run without
// the UPDATE and DELETE of sqlPartClaim, which PostgreSQL prepares for
// every partition. It looks the key up in the partitions from
// {{LOOKUP_FROM}} on, as every statement that looks a key up does
// (partClaims). Parameters: $1 scope, $2 key, $3 fingerprint, $4 expiry
// and $5 purge time in microseconds from now(), $6 the message UUID.
const sqlPartClaimNew = `
INSERT INTO {{TABLE}} (scope, key, fingerprint, status, token, attempt, taken_over,
	expires_at, purge_at, created_at, updated_at, message_uuid, claimed_at)
SELECT $1::text, $2::text, $3::text, {{SUCCEEDED}}, {{NEW_TOKEN}}, 1, false,
	now() + $4::int8 * interval '1 microsecond', now() + $5::int8 * interval '1 microsecond', now(), now(), $6::text, clock_timestamp()
WHERE NOT EXISTS (SELECT 1 FROM {{TABLE}} t WHERE t.scope = $1::text AND t.key = $2::text AND t.claimed_at >= {{LOOKUP_FROM}})
RETURNING token`

// sqlPartClaimNewCurrent is sqlPartClaimNew in one statement, as the
// DELETE layout's sqlClaimNew is: the key's advisory lock without waiting
// and the insert, which ON CONFLICT DO NOTHING turns into nothing when the
// partition holds a row of the key. A claim sends it in place of the lock
// and sqlPartClaimNew when the key filters leave one partition to look the
// key up in, {{PARTITION}}, [{{LOOKUP_FROM}}, {{UNTIL}}), and that
// partition is the one of now and has a unique index on (scope, key)
// (keyed). Then no lookup is needed, though the statement's snapshot is
// taken before the lock:
//   - a row of the key in the partition, committed or not, is what the
//     unique index checks the insert against, whatever the snapshot;
//   - the closed partitions before it cannot hold the key (their filters,
//     built after every transaction that could write to them ended);
//   - a row after it has a claimed_at at or past {{UNTIL}}, read after its
//     claim took the key's lock, and that claim held the lock until it
//     ended. This claim reads the clock after its own lock and inserts
//     only when the clock is before {{UNTIL}}, so it took the lock first:
//     the other claim waited for it, and its lookup, after its lock, found
//     this claim's row.
//
// It inserts into the partition by name, which spares the routing of the
// row; its claimed_at is the clock, held inside the partition's range when
// the clock turned between the check and the row. It returns the token, or
// nothing when the lock is held, the key has a row in the partition or the
// clock is outside the partition's range: the claim then goes on as
// sqlPartClaimNew's does. Parameters as sqlClaimNew's: $1 scope, $2 key,
// $3 fingerprint, $4 expiry and $5 purge time in microseconds from now(),
// $6 the key's lock, $7 the message UUID.
const sqlPartClaimNewCurrent = `
INSERT INTO {{PARTITION}} (scope, key, fingerprint, status, token, attempt, taken_over,
	expires_at, purge_at, created_at, updated_at, message_uuid, claimed_at)
SELECT $1::text, $2::text, $3::text, {{SUCCEEDED}}, {{NEW_TOKEN}}, 1, false,
	now() + $4::int8 * interval '1 microsecond', now() + $5::int8 * interval '1 microsecond', now(), now(), $7::text,
	least(greatest(clock_timestamp(), {{LOOKUP_FROM}}), {{UNTIL}} - interval '1 microsecond')
WHERE CASE WHEN ` + sqlReadCommitted + ` AND pg_try_advisory_xact_lock({{CLAIM_LOCK}}, $6) THEN clock_timestamp() >= {{LOOKUP_FROM}} AND clock_timestamp() < {{UNTIL}} ELSE false END
ON CONFLICT DO NOTHING
RETURNING token`

// sqlPartClaim takes the key after sqlPartLockLease or sqlPartLockTx, with
// the decisions of sqlClaim: a new key is inserted in the current
// partition; a row it takes is updated in place, or, when it is aged ($7,
// filterDelay in microseconds), deleted and inserted again in the
// current partition, carrying its token and attempt count, so that an old
// partition is not kept alive by the keys claimed again after it; a row it
// does not take is returned with the decision. Parameters as sqlClaim's:
// $4 expiry and $5 purge time in microseconds from now(), $6 the message
// UUID. A row it takes loses its retry_at (a moved row is inserted without
// one); a held-back row is answered Held, with retry_at and the time left
// (retryIn), as sqlClaim does.
var sqlPartClaim = `
WITH ` + strings.ReplaceAll(partLookup, "$W", "$7") + `,
upd AS (
	UPDATE {{TABLE}} t SET
		status = {{NEW_STATUS}},
		token = greatest(nextval({{SEQ_LITERAL}}), take.token + 1),
		attempt = CASE WHEN take.free THEN 1 ELSE take.attempt + 1 END,
		taken_over = (take.status = {{IN_PROGRESS}}),
		fingerprint = CASE WHEN take.free OR $3::text <> '' THEN $3::text ELSE take.fingerprint END,
		expires_at = now() + $4::int8 * interval '1 microsecond',
		purge_at = now() + $5::int8 * interval '1 microsecond',
		result = NULL,
		error_kind = NULL,
		error_message = NULL,
		created_at = CASE WHEN take.free THEN now() ELSE take.created_at END,
		updated_at = now(),
		message_uuid = $6::text,
		retry_at = NULL
	FROM take
	WHERE NOT take.aged AND t.scope = take.scope AND t.key = take.key AND t.claimed_at = take.claimed_at AND t.claimed_at >= {{LOOKUP_FROM}}
	RETURNING t.fingerprint, t.token, t.attempt, t.taken_over, t.created_at, t.updated_at, t.expires_at),
ins AS (
	INSERT INTO {{TABLE}} (scope, key, fingerprint, status, token, attempt, taken_over,
		expires_at, purge_at, created_at, updated_at, message_uuid, claimed_at)
	SELECT $1::text, $2::text,
		CASE WHEN m.scope IS NULL OR m.free OR $3::text <> '' THEN $3::text ELSE m.fingerprint END,
		{{NEW_STATUS}},
		CASE WHEN m.scope IS NULL THEN nextval({{SEQ_LITERAL}}) ELSE greatest(nextval({{SEQ_LITERAL}}), m.token + 1) END,
		CASE WHEN m.scope IS NULL OR m.free THEN 1 ELSE m.attempt + 1 END,
		coalesce(m.status = {{IN_PROGRESS}}, false),
		now() + $4::int8 * interval '1 microsecond', now() + $5::int8 * interval '1 microsecond',
		CASE WHEN m.scope IS NULL OR m.free THEN now() ELSE m.created_at END, now(), $6::text, clock_timestamp()
	FROM (SELECT 1) one LEFT JOIN moved m ON true
	WHERE m.scope IS NOT NULL OR NOT EXISTS (SELECT 1 FROM o)
	RETURNING fingerprint, token, attempt, taken_over, created_at, updated_at, expires_at),
done AS (SELECT * FROM upd UNION ALL SELECT * FROM ins)
SELECT {{EXECUTE}}::int2, d.fingerprint, {{IN_PROGRESS}}::int2, d.token, d.attempt, d.taken_over,
	NULL::bytea, ''::text, ''::text, d.created_at, d.updated_at, d.expires_at, $6::text, NULL::timestamptz, 0::int8{{TAKEN}}
FROM done d
UNION ALL
SELECT
	(CASE
		WHEN $3::text <> '' AND o.fingerprint <> '' AND $3::text <> o.fingerprint THEN {{MISMATCH}}
		WHEN o.status = {{IN_PROGRESS}} AND o.expires_at > now() THEN {{IN_PROGRESS_DECISION}}
		WHEN o.status = {{RETRYABLE}} AND o.retry_at > now() THEN {{IN_PROGRESS_DECISION}}
		WHEN o.status IN ({{SUCCEEDED}}, {{FAILED}}) THEN {{REPLAY}}
		ELSE 0
	END)::int2,
	o.fingerprint, o.status, o.token, o.attempt, o.taken_over,
	o.result, coalesce(o.error_kind, ''), coalesce(o.error_message, ''), o.created_at, o.updated_at, o.expires_at, o.message_uuid,
	o.retry_at, ` + retryIn("o") + `{{ANSWERED}}
FROM o
WHERE NOT (o.free OR o.carry)`

// sqlPartRecordRollback is sqlRecordRollback after the key's advisory lock
// was taken without waiting (RecordRollback gives up when another claim
// holds it): it writes where a claim could take the key, moving an aged
// row like sqlPartClaim, and returns how many rows it wrote (0 or 1).
// Parameters as sqlRecordRollback's, but $11 is filterDelay (aged; the
// lock was taken before); $13 the pause before the next attempt (retry_at).
var sqlPartRecordRollback = `
WITH ` + strings.ReplaceAll(partLookup, "$W", "$11") + `,
upd AS (
	UPDATE {{TABLE}} t SET
		status = $4::int2,
		token = greatest(take.token, $5::int8),
		attempt = greatest(take.attempt, $6::int4),
		taken_over = false,
		fingerprint = CASE WHEN take.free OR $3::text <> '' THEN $3::text ELSE take.fingerprint END,
		result = NULL,
		error_kind = nullif($8::text, ''),
		error_message = nullif($9::text, ''),
		expires_at = now() + $7::int8 * interval '1 microsecond',
		purge_at = now() + $10::int8 * interval '1 microsecond',
		created_at = CASE WHEN take.free THEN now() ELSE take.created_at END,
		updated_at = now(),
		message_uuid = $12::text,
		retry_at = ` + retryAtFrom("$13") + `
	FROM take
	WHERE NOT take.aged AND t.scope = take.scope AND t.key = take.key AND t.claimed_at = take.claimed_at AND t.claimed_at >= {{LOOKUP_FROM}}
	RETURNING 1),
ins AS (
	INSERT INTO {{TABLE}} (scope, key, fingerprint, status, token, attempt, taken_over,
		error_kind, error_message, expires_at, purge_at, created_at, updated_at, message_uuid, claimed_at, retry_at)
	SELECT $1::text, $2::text,
		CASE WHEN m.scope IS NULL OR m.free OR $3::text <> '' THEN $3::text ELSE m.fingerprint END,
		$4::int2, greatest(m.token, $5::int8), greatest(m.attempt, $6::int4), false,
		nullif($8::text, ''), nullif($9::text, ''),
		now() + $7::int8 * interval '1 microsecond', now() + $10::int8 * interval '1 microsecond',
		CASE WHEN m.scope IS NULL OR m.free THEN now() ELSE m.created_at END, now(), $12::text, clock_timestamp(),
		` + retryAtFrom("$13") + `
	FROM (SELECT 1) one LEFT JOIN moved m ON true
	WHERE m.scope IS NOT NULL OR NOT EXISTS (SELECT 1 FROM o)
	RETURNING 1)
SELECT (SELECT count(*) FROM upd) + (SELECT count(*) FROM ins)`

// sqlPartTryLock takes the key's advisory lock ($1) without waiting.
const sqlPartTryLock = `SELECT pg_try_advisory_xact_lock({{CLAIM_LOCK}}, $1)`

// sqlPartLockDeferred is a deferred claim's lock (internal/claimtx): the key's
// advisory lock ($1) without waiting, or a failure (deferredMarker) when
// another claim holds it, which refuses the claim.
const sqlPartLockDeferred = `SELECT (CASE WHEN ` + sqlReadCommitted + ` AND pg_try_advisory_xact_lock({{CLAIM_LOCK}}, $1) THEN '1' ELSE '` + deferredMarker + `' END)::int8`

// sqlKeyFiltersTable holds the key filter of each closed partition
// (keyfilters.go): a blocked Bloom filter of its keys, dumped by
// github.com/greatroar/blobloom with keyFilterHash as its comment. Created
// by Migrate beside the partitioned table, of any version: a table that
// has none only means that every claim looks a key up in every partition.
const sqlKeyFiltersTable = `
CREATE TABLE IF NOT EXISTS {{KEY_FILTERS}} (
	partition   text PRIMARY KEY,
	lower_bound timestamptz NOT NULL,
	upper_bound timestamptz NOT NULL,
	keys        bigint NOT NULL,
	filter      bytea NOT NULL,
	built_at    timestamptz NOT NULL DEFAULT now()
)`

// Partition upkeep.

// sqlPartitions is now() and the partitions of the table ($1) with their
// bounds, state (0 attached, 1 detaching) and whether a unique index keeps
// a key to one row in them (keyed: every partition the store creates, and
// a converted table; not one made by hand without it), oldest first, read
// from the catalog, then the tables of schema $2 that the upkeep detached
// and did not drop (state 2, no bounds: their comment is $3). One row with
// a NULL name when there is none of either, so that now() comes back in
// the same round trip.
//
// pg_get_expr prints the bounds in the session's time zone with its
// offset, so the casts give them back exactly; given no relation, it locks
// none, so it never waits for a partition being detached. The partition a
// converted table became starts at MINVALUE, read as year 1; a bound of
// another form, made by hand, reads as from year 1 to now. The bounds are
// cut at their quotes (split_part) and the index's columns are found by
// name, where a regular expression and an aggregate of the column names,
// for every partition, took most of the statement's time: every pass
// lists.
const sqlPartitions = `
WITH parts AS (
	SELECT c.relname::text AS name,
		CASE WHEN ranged THEN split_part(b, '''', 2)::timestamptz ELSE '0001-01-01 00:00:00+00' END AS lower,
		CASE WHEN ranged THEN split_part(b, '''', 4)::timestamptz
			WHEN b LIKE 'FOR VALUES FROM (MINVALUE) TO (''%'')' THEN split_part(b, '''', 2)::timestamptz END AS upper,
		CASE WHEN i.inhdetachpending THEN 1 ELSE 0 END AS state,
		EXISTS (
			SELECT 1 FROM pg_index x
			JOIN pg_attribute s ON s.attrelid = c.oid AND s.attname = 'scope'
			JOIN pg_attribute k ON k.attrelid = c.oid AND k.attname = 'key'
			WHERE x.indrelid = c.oid AND x.indisunique AND x.indisvalid AND x.indnkeyatts = 2
				AND x.indexprs IS NULL AND x.indpred IS NULL
				AND ((x.indkey[0] = s.attnum AND x.indkey[1] = k.attnum) OR (x.indkey[0] = k.attnum AND x.indkey[1] = s.attnum))) AS keyed
	FROM pg_inherits i
	JOIN pg_class c ON c.oid = i.inhrelid
	CROSS JOIN LATERAL pg_get_expr(c.relpartbound, 0) b
	CROSS JOIN LATERAL (SELECT b LIKE 'FOR VALUES FROM (''%'') TO (''%'')' AS ranged) r
	WHERE i.inhparent = to_regclass($1)
	UNION ALL
	SELECT c.relname::text, '0001-01-01 00:00:00+00'::timestamptz, '0001-01-01 00:00:00+00'::timestamptz, 2, false
	FROM pg_class c
	WHERE c.relnamespace = to_regnamespace($2)::oid AND c.relkind = 'r' AND NOT c.relispartition
		AND obj_description(c.oid, 'pg_class') = $3::text)
SELECT now(), parts.name, coalesce(parts.lower, now()), coalesce(parts.upper, now()), coalesce(parts.state, 0), coalesce(parts.keyed, false)
FROM (SELECT 1) one LEFT JOIN parts ON true
ORDER BY parts.state = 2 DESC, parts.lower`

// sqlOlderLockers reports whether another transaction that began before $2
// holds a lock on the table ($1) or one of its partitions (a prepared
// transaction, which has no start time, counts, and so does a session of
// another role when this one may not read its start: pg_read_all_stats).
// Autovacuum is left out.
const sqlOlderLockers = `
SELECT EXISTS (
	SELECT 1
	FROM pg_locks l
	LEFT JOIN pg_stat_activity a ON a.pid = l.pid
	WHERE l.locktype = 'relation'
		AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
		AND (l.relation = to_regclass($1) OR l.relation IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass($1)))
		AND l.pid IS DISTINCT FROM pg_backend_pid()
		AND coalesce(a.backend_type, '') <> 'autovacuum worker'
		AND (a.xact_start IS NULL OR a.xact_start < $2::timestamptz))`

// sqlPartitionLive is the time the last row of a partition ({{PART}}) may
// go (it is past its purge time and expired), NULL when it is empty, and
// how many rows it holds, over the pages [$1, $2) (a TID range scan:
// readClosed reads a partition a chunk at a time).
const sqlPartitionLive = `SELECT max(greatest(purge_at, expires_at)), count(*) FROM {{PART}} WHERE ctid >= $1::tid AND ctid < $2::tid`

// sqlPartitionKeys is, for every row of a partition ({{PART}}) in the pages
// [$1, $2), its key and the time sqlPartitionLive takes the latest of: the
// read that builds the partition's key filter gives its drop time too
// (retireClosed).
const sqlPartitionKeys = `SELECT scope, key, greatest(purge_at, expires_at) FROM {{PART}} WHERE ctid >= $1::tid AND ctid < $2::tid`

// sqlPartitionPages is how many pages a partition ($1) has, read by the
// statement that takes readClosed's snapshot.
const sqlPartitionPages = `SELECT pg_relation_size($1::regclass) / current_setting('block_size')::int8`

// partLive is what the partitioned layout adds to Complete and Release:
// they refuse a row past its purge time and expired, which the DELETE
// layout's cleanup may have deleted already, so that no write makes a row
// of a partition being dropped live again (dropPartition).
const partLive = `
	AND (expires_at > now() OR purge_at > now())`

// partFresh is what the partitioned layout adds to the in-place Complete,
// Release and Extend: the row was claimed less than filterDelay ago
// ({{AGED}}, microseconds). An older row may be in a closed partition whose
// drop time the cleaner has read (closedRead.last): it is moved instead
// (partMove), so no write pushes that time out after the read. Most
// handlers finish within filterDelay (a minute): one HOT update, as in the
// DELETE layout.
const partFresh = `
	AND claimed_at > statement_timestamp() - {{AGED}}::int8 * interval '1 microsecond'`

// sqlPartExtend is sqlExtend for a row partFresh holds.
const sqlPartExtend = `
UPDATE {{TABLE}} SET
	expires_at = now() + $4::int8 * interval '1 microsecond',
	updated_at = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND status = {{IN_PROGRESS}} AND expires_at > now()` + partFresh + `
RETURNING attempt, expires_at`

// partMove is Complete, Release or Extend of a lease's row, sent after the
// in-place form touched no row (partFresh): the row, wherever it is, is
// deleted and inserted again in the current partition ({{SET}}: the
// columns the write changes; the others are copied), with claimed_at the
// clock. It takes the key's advisory lock ($L) first, as a claim does, so
// that a claim's lookup, after its own lock, sees the row in one partition
// or the other (sql_partitioned.go); the DELETE re-checks the newest
// version of a row a claim changed before the lock was granted. No row:
// the lease was lost. {{WHERE}} and {{RETURNING}} are the write's own.
const partMove = `
WITH l AS MATERIALIZED (SELECT pg_advisory_xact_lock({{CLAIM_LOCK}}, $L::int4)),
d AS (
	DELETE FROM {{TABLE}} t USING l
	WHERE t.scope = $1 AND t.key = $2 AND t.token = $3 AND t.status = {{IN_PROGRESS}}{{WHERE}}
	RETURNING t.*)
INSERT INTO {{TABLE}} (scope, key, fingerprint, status, token, attempt, taken_over, result, error_kind, error_message,
	created_at, updated_at, expires_at, purge_at, message_uuid, claimed_at, retry_at)
SELECT scope, key, fingerprint, {{STATUS}}, token, {{ATTEMPT}}, taken_over, {{RESULT}},
	created_at, now(), {{EXPIRES}}, purge_at, message_uuid, clock_timestamp(), {{RETRY_AT}}
FROM d{{RETURNING}}`

// The forms of partMove.
var (
	// sqlPartCompleteMove is Complete's: parameters as sqlComplete's, $9 the lock.
	sqlPartCompleteMove = strings.NewReplacer("$L", "$9", "{{WHERE}}", " AND (t.expires_at > now() OR t.purge_at > now())",
		"{{STATUS}}", "$4::int2", "{{ATTEMPT}}", "attempt", "{{RESULT}}", "$5::bytea, nullif($6::text, ''), nullif($7::text, '')",
		"{{EXPIRES}}", "now() + $8::int8 * interval '1 microsecond'", "{{RETRY_AT}}", "retry_at", "{{RETURNING}}", "").Replace(partMove)
	// sqlPartReleaseMove is Release's: parameters as sqlRelease's, $7 the lock.
	sqlPartReleaseMove = strings.NewReplacer("$L", "$7", "{{WHERE}}", " AND (t.expires_at > now() OR t.purge_at > now())",
		"{{STATUS}}", "{{RETRYABLE}}", "{{ATTEMPT}}", "attempt - $5::int4", "{{RESULT}}", "result, error_kind, error_message",
		"{{EXPIRES}}", "now() + $4::int8 * interval '1 microsecond'", "{{RETRY_AT}}", retryAtFrom("$6"), "{{RETURNING}}", "").Replace(partMove)
	// sqlPartExtendMove is Extend's: parameters as sqlExtend's, $5 the lock.
	sqlPartExtendMove = strings.NewReplacer("$L", "$5", "{{WHERE}}", " AND t.expires_at > now()",
		"{{STATUS}}", "status", "{{ATTEMPT}}", "attempt", "{{RESULT}}", "result, error_kind, error_message",
		"{{EXPIRES}}", "now() + $4::int8 * interval '1 microsecond'", "{{RETRY_AT}}", "retry_at",
		"{{RETURNING}}", "\nRETURNING attempt, expires_at").Replace(partMove)
)

// sqlPartClaimNewCurrentDeferred is sqlPartClaimNewCurrent's deferred form:
// claimed_at is the clock read after the key's lock ($6) was taken, NULL
// when it is held; the partition's own range, which PostgreSQL checks on
// an insert into a partition by name, stands for the statement's check of
// the clock against [{{LOOKUP_FROM}}, {{UNTIL}}), its bounds, so
// sqlPartClaimNewCurrent's argument holds as it is. Parameters as
// sqlClaimNew's.
const sqlPartClaimNewCurrentDeferred = `
INSERT INTO {{PARTITION}} (scope, key, fingerprint, status, token, attempt, taken_over,
	expires_at, purge_at, created_at, updated_at, message_uuid, claimed_at)
VALUES ($1::text, $2::text, $3::text, {{SUCCEEDED}}, {{NEW_TOKEN}}, 1, false,
	now() + $4::int8 * interval '1 microsecond', now() + $5::int8 * interval '1 microsecond', now(), now(), $7::text,
	CASE WHEN ` + sqlReadCommitted + ` AND pg_try_advisory_xact_lock({{CLAIM_LOCK}}, $6) THEN clock_timestamp() END)`

// deferredForm turns sqlPartClaimNew, an insert that returns the token, or
// nothing when the key has a row, into a deferred claim's, which fails
// instead of returning nothing.
func deferredForm(insert string) string {
	return "WITH ins AS (" + firstTokenLiteral.Replace(insert) + ")\n" +
		"SELECT coalesce((SELECT token::text FROM ins), '" + deferredMarker + "')::int8"
}
