package postgres

import (
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/claimtx"
)

// names are the quoted, schema-qualified names of the store's objects. Every
// one is built from validated identifiers by pgx.Identifier.Sanitize, so no
// caller-supplied text ever reaches SQL unquoted; values always travel as
// parameters.
type names struct {
	schema   string // "schema"
	table    string // "schema"."table"
	seq      string // "schema"."table_token_seq"
	seqLit   string // '"schema"."table_token_seq"', for nextval
	index    string // "table_expires_at_idx", migration 1's index (unqualified: CREATE INDEX names it in the table's schema)
	purge    string // "table_purge_at_idx"
	versions string // "schema"."table_migrations"
	// keyFilterTable is the partitioned layout's
	// "schema"."table_key_filters" (keyfilters.go).
	keyFilterTable string
	// watermarks is the watermark mode's table, one row per Kafka
	// partition (internal/watermark): "schema"."table_watermarks".
	watermarks string
	// claimLock is the first half of the advisory lock key of a claim:
	// the table's, so that claims of different tables never meet.
	claimLock int32
}

func newNames(schema, table string) names {
	seq := pgx.Identifier{schema, table + "_token_seq"}.Sanitize()
	n := names{
		schema:     pgx.Identifier{schema}.Sanitize(),
		table:      pgx.Identifier{schema, table}.Sanitize(),
		seq:        seq,
		seqLit:     "'" + seq + "'", // identifiers are [a-z0-9_]: no quote to escape
		index:      pgx.Identifier{table + "_expires_at_idx"}.Sanitize(),
		purge:      pgx.Identifier{table + "_purge_at_idx"}.Sanitize(),
		versions:   pgx.Identifier{schema, table + "_migrations"}.Sanitize(),
		watermarks: pgx.Identifier{schema, table + "_watermarks"}.Sanitize(),
	}
	n.keyFilterTable = pgx.Identifier{schema, table + "_key_filters"}.Sanitize()
	n.claimLock = int32(lockKey("claim", n))
	return n
}

// timestampLiteral is t as an SQL constant of type timestamptz, for the
// bounds written into statements and DDL (which take no parameters).
func timestampLiteral(t time.Time) string {
	return "'" + t.UTC().Format(time.RFC3339Nano) + "'::timestamptz"
}

// render replaces the placeholders of a statement or migration.
func (n names) render(sql string) string {
	return strings.NewReplacer(
		"{{SCHEMA}}", n.schema,
		"{{TABLE}}", n.table,
		"{{SEQ}}", n.seq,
		"{{SEQ_LITERAL}}", n.seqLit,
		"{{INDEX}}", n.index,
		"{{PURGE_INDEX}}", n.purge,
		"{{CLAIM_LOCK}}", fmt.Sprint(n.claimLock),
		"{{VERSIONS}}", n.versions,
		"{{KEY_FILTERS}}", n.keyFilterTable,
		"{{WATERMARKS}}", n.watermarks,
		// Codes shared with Go, so the SQL cannot drift from them.
		"{{IN_PROGRESS}}", fmt.Sprint(int(store.StatusInProgress)),
		"{{SUCCEEDED}}", fmt.Sprint(int(store.StatusSucceeded)),
		"{{FAILED}}", fmt.Sprint(int(store.StatusCachedFailure)),
		"{{RETRYABLE}}", fmt.Sprint(int(store.StatusRetryable)),
		"{{EXECUTE}}", fmt.Sprint(int(store.DecisionExecute)),
		"{{REPLAY}}", fmt.Sprint(int(store.DecisionReplay)),
		"{{IN_PROGRESS_DECISION}}", fmt.Sprint(int(store.DecisionHeld)),
		"{{MISMATCH}}", fmt.Sprint(int(store.DecisionMismatch)),
	).Replace(sql)
}

// lockKey is an advisory lock key for one purpose on one table.
func lockKey(purpose string, n names) int64 {
	h := fnv.New64a()
	h.Write([]byte("oncemill:" + purpose + ":" + n.table))
	return int64(h.Sum64())
}

// migrateLockKey serializes every oncemill migration in a database, whatever
// the table: two stores creating one new schema at once must not race.
var migrateLockKey = func() int64 {
	h := fnv.New64a()
	h.Write([]byte("oncemill:migrate"))
	return int64(h.Sum64())
}()

// Every statement names one row by its primary key, or walks the purge_at
// index in order: no plan the planner may choose for them scans the table,
// whatever its size or statistics (TestPlansUseIndexes). Durations travel
// as microseconds.
//
// The record is free when it finished or was released and has expired: the
// next claim starts again at attempt 1. The predicates below are written
// once and used both where the upsert decides and where the answer is
// explained, so the two cannot disagree.
const (
	// o is the existing row inside ON CONFLICT DO UPDATE.
	freeO = `(o.status <> {{IN_PROGRESS}} AND o.expires_at <= now())`
	// carry: an expired lease (takeover) or a live released record that
	// nothing holds back (retry_at): the new delivery carries the attempt
	// count on, if the payload is the same.
	carryO = `((o.status = {{IN_PROGRESS}} AND o.expires_at <= now()) OR (o.status = {{RETRYABLE}} AND o.expires_at > now() AND ` + notHeldBackO + `))`
	// notHeldBack: no retry_at in the future (Completion.RetryAfter).
	notHeldBackO = `(o.retry_at IS NULL OR o.retry_at <= now())`
	fpOkO        = `(excluded.fingerprint = '' OR o.fingerprint = '' OR excluded.fingerprint = o.fingerprint)`
)

// sqlClaim is the one statement that takes a key, in two forms: ClaimLease's
// (lease mode) writes an in-progress row that expires with the lease;
// Claim's (one-transaction mode) runs inside the handler's transaction and
// writes the row in its final succeeded form, which only its commit makes
// visible. Parameters: $1 scope, $2 key, $3 fingerprint, $4 the expiry of
// the new row and $5 its purge time, both in microseconds from now(), $6
// the message UUID (the last claimer's is kept).
//
// The upsert takes the key when it is absent, free, or carried on. For a
// key it did not take, the second half of the UNION returns the row as the
// statement's snapshot saw it, with the decision: Replay, Held or
// Mismatch; Held also for a retryable row that retry_at holds back, with
// retry_at and the time left in microseconds (the last columns but
// {{POST}}'s): no attempt, and the row is left as it is. Decision 0, or no
// row at all, is the READ COMMITTED corner: another transaction changed or
// inserted the row after this statement's snapshot was taken (the upsert
// saw the newest version, the SELECT an older one, or none). The caller
// runs the statement again.
//
// Tokens: a taken-over or reused row gets the greater of nextval() and its
// token + 1 in DO UPDATE, after the row is locked, so it exceeds every token
// the row had (each backend caches its own block of sequence values, so
// nextval alone does not rise across backends). A fresh insert takes
// nextval(); it can only come out lower than an earlier token of the same
// key if that key's row was deleted (by cleanup, past its purge time, or by
// an operator) or its claim rolled back.
var sqlClaim = `
WITH {{PRE}}up AS (
	INSERT INTO {{TABLE}} AS o (scope, key, fingerprint, status, token, attempt, taken_over,
		expires_at, purge_at, created_at, updated_at, message_uuid)
	SELECT $1::text, $2::text, $3::text, {{NEW_STATUS}}, nextval({{SEQ_LITERAL}}), 1, false,
		now() + $4::int8 * interval '1 microsecond', now() + $5::int8 * interval '1 microsecond', now(), now(), $6::text
	{{FROM}}
	ON CONFLICT (scope, key) DO UPDATE SET
		status = {{NEW_STATUS}},
		token = greatest(nextval({{SEQ_LITERAL}}), o.token + 1),
		attempt = CASE WHEN ` + freeO + ` THEN 1 ELSE o.attempt + 1 END,
		taken_over = (o.status = {{IN_PROGRESS}}),
		fingerprint = CASE WHEN ` + freeO + ` OR excluded.fingerprint <> '' THEN excluded.fingerprint ELSE o.fingerprint END,
		expires_at = excluded.expires_at,
		purge_at = excluded.purge_at,
		result = NULL,
		error_kind = NULL,
		error_message = NULL,
		created_at = CASE WHEN ` + freeO + ` THEN now() ELSE o.created_at END,
		updated_at = now(),
		message_uuid = excluded.message_uuid,
		retry_at = NULL
	WHERE ` + freeO + ` OR (` + carryO + ` AND ` + fpOkO + `)
	RETURNING o.fingerprint, o.token, o.attempt, o.taken_over, o.created_at, o.updated_at, o.expires_at
)
SELECT {{EXECUTE}}::int2, up.fingerprint, {{IN_PROGRESS}}::int2, up.token, up.attempt, up.taken_over,
	NULL::bytea, ''::text, ''::text, up.created_at, up.updated_at, up.expires_at, $6::text, NULL::timestamptz, 0::int8{{POST}}{{TAKEN}}
FROM up{{JOIN}}
UNION ALL
SELECT
	(CASE
		WHEN t.status <> {{IN_PROGRESS}} AND t.expires_at <= now() THEN 0
		WHEN $3 <> '' AND t.fingerprint <> '' AND $3 <> t.fingerprint THEN {{MISMATCH}}
		WHEN t.status = {{IN_PROGRESS}} AND t.expires_at > now() THEN {{IN_PROGRESS_DECISION}}
		WHEN t.status = {{RETRYABLE}} AND t.retry_at > now() THEN {{IN_PROGRESS_DECISION}}
		WHEN t.status IN ({{SUCCEEDED}}, {{FAILED}}) THEN {{REPLAY}}
		ELSE 0
	END)::int2,
	t.fingerprint, t.status, t.token, t.attempt, t.taken_over,
	t.result, coalesce(t.error_kind, ''), coalesce(t.error_message, ''), t.created_at, t.updated_at, t.expires_at, t.message_uuid,
	t.retry_at, ` + retryIn("t") + `{{POST}}{{ANSWERED}}
FROM {{TABLE}} t{{JOIN}}
WHERE t.scope = $1 AND t.key = $2 AND NOT EXISTS (SELECT 1 FROM up)`

// retryIn is the time left, in microseconds, until the retry_at of the row
// named row (0 when none is left): a held-back claim's ClaimResult.RetryIn.
func retryIn(row string) string {
	return `greatest(coalesce(ceil(extract(epoch FROM ` + row + `.retry_at - now()) * 1000000)::int8, 0), 0)`
}

// retryAtFrom is the retry_at a release writes: $N microseconds from now()
// (Completion.RetryAfter), NULL for none.
func retryAtFrom(param string) string {
	return `CASE WHEN ` + param + `::int8 > 0 THEN now() + ` + param + `::int8 * interval '1 microsecond' END`
}

// The forms of sqlClaim.
var (
	// beginForm is ClaimLease's: an in-progress row.
	beginForm = strings.NewReplacer("{{PRE}}", "", "{{FROM}}", "", "{{POST}}", "", "{{JOIN}}", "",
		"{{TAKEN}}", leaseTaken, "{{ANSWERED}}", leaseAnswered,
		"{{NEW_STATUS}}", "{{IN_PROGRESS}}")
	// asyncBeginForm is ClaimLease's with Options.AsyncBegin: the statement's own
	// transaction commits without waiting for the WAL flush.
	// set_config(.., true) lasts until the end of that transaction, whose
	// commit reads it; the CTE is joined so that it is evaluated.
	asyncBeginForm = strings.NewReplacer(
		"{{PRE}}", "async AS (SELECT set_config('synchronous_commit', 'off', true)), ",
		"{{FROM}}", "FROM async", "{{POST}}", "", "{{JOIN}}", "",
		"{{TAKEN}}", leaseTaken, "{{ANSWERED}}", leaseAnswered,
		"{{NEW_STATUS}}", "{{IN_PROGRESS}}")
	// claimForm is Claim's: the row in its final form, and a bound on the
	// wait for a row another transaction holds. lock_timeout ($7, in
	// milliseconds) is set before the upsert runs (the upsert reads the
	// materialized CTE first) and put back to what it was in the same
	// statement, so the handler's own statements keep the session's value.
	// Its answers change nothing: the handler's transaction commits as the
	// handler's settings say.
	claimForm = strings.NewReplacer(
		"{{PRE}}", "lt AS MATERIALIZED (SELECT current_setting('lock_timeout') AS prior, set_config('lock_timeout', ($7::int8)::text, true), pg_advisory_xact_lock({{CLAIM_LOCK}}, $8)), ",
		"{{FROM}}", "FROM lt", "{{POST}}", ", set_config('lock_timeout', lt.prior, true)", "{{JOIN}}", " CROSS JOIN lt",
		"{{TAKEN}}", "", "{{ANSWERED}}", "",
		"{{NEW_STATUS}}", "{{SUCCEEDED}}")
)

// A lease claim that does not take the key (a replay, Held, Mismatch)
// writes nothing but the row lock of its upsert or its FOR UPDATE; that
// lock gives the statement's transaction an xid, and its commit would wait
// for the WAL flush (and a synchronous standby) for nothing a crash could
// lose. The answered branch of a lease claim turns synchronous_commit off
// for its own transaction (leaseAnswered), the branch that takes the key
// leaves it as it is (leaseTaken, the same column's NULL): so a replay
// costs no flush, and a lease taken is as durable as the settings say.
const (
	leaseTaken    = ", NULL::text"
	leaseAnswered = ", set_config('synchronous_commit', 'off', true)"
)

// sqlClaimNew is Claim's fast path, sent with BEGIN: a new key costs one
// plain insert of the record in its final form, the statement of a
// hand-written inbox with the record's columns. It never waits: it first
// takes the key's advisory lock ($6, in a space of the table's own) without
// waiting, which every claim of the key holds until its transaction ends,
// so that no other claim of the key can be in flight when it inserts. It
// inserts a row, or none when the key is held or has a row: the claim then
// goes on with sqlClaim's claimForm in the same transaction, which waits
// for the lock and decides (a replay then costs BEGIN with this, the
// claim, and ROLLBACK). $7 is the message UUID. The token is {{NEW_TOKEN}},
// claimtx.Token: known before the statement runs, it need not be returned,
// and the caller reads the insert's row count alone. Returning the row, or
// answering a replay in the same statement (a CTE and a UNION), cost every
// new key more on the server than a duplicate's third round trip costs it.
const sqlClaimNew = `
INSERT INTO {{TABLE}} (scope, key, fingerprint, status, token, attempt, taken_over,
	expires_at, purge_at, created_at, updated_at, message_uuid)
SELECT $1::text, $2::text, $3::text, {{SUCCEEDED}}, {{NEW_TOKEN}}, 1, false,
	now() + $4::int8 * interval '1 microsecond', now() + $5::int8 * interval '1 microsecond', now(), now(), $7::text
WHERE pg_try_advisory_xact_lock({{CLAIM_LOCK}}, $6)
ON CONFLICT (scope, key) DO NOTHING`

// sqlCommitResult, sent with COMMIT in one round trip, stores the produced
// messages of a one-transaction success and counts its expiry from now
// (clock_timestamp: now() is the transaction's start). The row is this
// transaction's own. Sent only when there is something to write.
const sqlCommitResult = `
UPDATE {{TABLE}} SET
	result = $3,
	expires_at = greatest(expires_at, clock_timestamp() + $4::int8 * interval '1 microsecond'),
	updated_at = clock_timestamp()
WHERE scope = $1 AND key = $2`

// sqlRecordRollback records what a rolled-back claim leaves behind ($4:
// failed or retryable, kept for $7 microseconds), unless the key is owned
// or finished by another delivery now: it writes only where a claim could
// take the key, so a newer claim's success or live lease is never
// overwritten, and not at all while another claim holds the key's advisory
// lock ($11), so it never waits for one, nor where a retryable record
// holds the key back (another delivery failed since). The attempt count
// ($6: the lease's, or one less for an uncounted attempt) never goes down.
// $12 is the message UUID of the rolled-back claim, $13 the pause before
// the next attempt in microseconds (retry_at; 0: none).
var sqlRecordRollback = `
INSERT INTO {{TABLE}} AS o (scope, key, fingerprint, status, token, attempt, taken_over,
	error_kind, error_message, expires_at, purge_at, created_at, updated_at, message_uuid, retry_at)
SELECT $1::text, $2::text, $3::text, $4::int2, $5::int8, $6::int4, false, nullif($8::text, ''), nullif($9::text, ''),
	now() + $7::int8 * interval '1 microsecond', now() + $10::int8 * interval '1 microsecond', now(), now(), $12::text,
	` + retryAtFrom("$13") + `
WHERE pg_try_advisory_xact_lock({{CLAIM_LOCK}}, $11)
ON CONFLICT (scope, key) DO UPDATE SET
	status = excluded.status,
	token = greatest(o.token, excluded.token),
	attempt = greatest(o.attempt, excluded.attempt),
	taken_over = false,
	fingerprint = CASE WHEN ` + freeO + ` OR excluded.fingerprint <> '' THEN excluded.fingerprint ELSE o.fingerprint END,
	result = NULL,
	error_kind = excluded.error_kind,
	error_message = excluded.error_message,
	expires_at = excluded.expires_at,
	purge_at = excluded.purge_at,
	created_at = CASE WHEN ` + freeO + ` THEN now() ELSE o.created_at END,
	updated_at = now(),
	message_uuid = excluded.message_uuid,
	retry_at = excluded.retry_at
WHERE ` + freeO + ` OR (` + carryO + ` AND ` + fpOkO + `)`

// sqlComplete writes a lease's outcome, only while the caller's token is
// current and the record in progress. It changes no indexed column: a HOT
// update.
const sqlComplete = `
UPDATE {{TABLE}} SET
	status = $4,
	result = $5,
	error_kind = nullif($6, ''),
	error_message = nullif($7, ''),
	expires_at = now() + $8::int8 * interval '1 microsecond',
	updated_at = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND status = {{IN_PROGRESS}}`

// sqlExtend pushes a live lease out. It refuses an expired lease.
const sqlExtend = `
UPDATE {{TABLE}} SET
	expires_at = now() + $4::int8 * interval '1 microsecond',
	updated_at = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND status = {{IN_PROGRESS}} AND expires_at > now()
RETURNING attempt, expires_at`

// sqlRelease keeps the attempt count for keep ($4), less $5 (1 for an
// uncounted attempt, else 0), and holds the next attempt back for $6
// microseconds (retry_at; 0: not at all).
var sqlRelease = `
UPDATE {{TABLE}} SET
	status = {{RETRYABLE}},
	attempt = attempt - $5::int4,
	expires_at = now() + $4::int8 * interval '1 microsecond',
	retry_at = ` + retryAtFrom("$6") + `,
	updated_at = now()
WHERE scope = $1 AND key = $2 AND token = $3 AND status = {{IN_PROGRESS}}`

// sqlReleaseDelete removes the record (Release with a TTL <= 0).
const sqlReleaseDelete = `
DELETE FROM {{TABLE}}
WHERE scope = $1 AND key = $2 AND token = $3 AND status = {{IN_PROGRESS}}`

// sqlGet returns the record while it is visible.
const sqlGet = `
SELECT ` + recordColumns + `
FROM {{TABLE}}
WHERE scope = $1 AND key = $2 AND expires_at > now()`

// recordColumns are a row as scanRecord reads it.
const recordColumns = `scope, key, fingerprint, status, token, attempt, result,
	coalesce(error_kind, ''), coalesce(error_message, ''), created_at, updated_at, expires_at, message_uuid, retry_at`

// sqlList is one page of Admin.List: rows after ($4, $5) in primary key
// order, filtered by scope ($1, ” for all), status ($2, 0 for all) and
// last update ($3, NULL for all) and message UUID ($7, empty for all). It
// walks the primary key: an operator's statement, not the delivery path's;
// with a message UUID it reads the whole table, message_uuid having no
// index (migration 3).
const sqlList = `
SELECT ` + recordColumns + `
FROM {{TABLE}}
WHERE (scope, key) > ($4::text, $5::text)
	AND ($1::text = '' OR scope = $1::text)
	AND ($2::int2 = 0 OR status = $2::int2)
	AND ($3::timestamptz IS NULL OR updated_at < $3::timestamptz)
	AND ($7::text = '' OR message_uuid = $7::text)
ORDER BY scope, key
LIMIT $6`

// sqlDelete deletes the row of ($1, $2) only under token $3, and says
// whether it did and whether the row exists (in the statement's snapshot,
// so a deleted row still counts as existing).
const sqlDelete = `
WITH d AS (DELETE FROM {{TABLE}} WHERE scope = $1 AND key = $2 AND token = $3 RETURNING 1)
SELECT EXISTS (SELECT 1 FROM d), EXISTS (SELECT 1 FROM {{TABLE}} WHERE scope = $1 AND key = $2)`

// purgeable is a row cleanup may remove: its purge time has come and it has
// expired. Rows whose expiry moved past their purge time (a long handler,
// an extended lease) wait for the expiry.
const purgeable = `purge_at <= now() AND expires_at <= now()`

// sqlCleanupBatch removes up to $1 purgeable rows whose purge time is at
// least $2, oldest first, and reports how many it removed and the newest
// purge time among them. A cleanup pass runs it in a loop, starting each
// batch where the previous one ended, so that it does not walk over the
// index entries of the rows it already deleted again and again; rows it
// skips (locked, or behind the cursor) are found by the next pass, which
// starts from the beginning. DeleteExpired is one batch from the beginning.
//
// The inner SELECT walks the purge_at index and locks what it picks with
// SKIP LOCKED, so it never waits for a claim that holds a row, and a claim
// waits at most for one short batch. FOR UPDATE re-checks the condition on
// the newest version of each row, so a row claimed meanwhile is left alone,
// and the rows stay locked until the DELETE, which finds them by ctid (a
// TID scan per row, which the lock keeps in place; with tableoid, as a
// ctid names a row in one partition of the partitioned layout's
// DeleteExpired): finding them by
// primary key instead cost a descent of that index per row and made a
// batch five times slower. A join, not ctid = ANY (ARRAY(..)), whose plan on a
// small table is a sequential scan (TestPlansUseIndexes).
//
// The batch commits without waiting for the WAL flush (set_config(..,
// true) lasts until its commit, which reads it): a crash may bring back
// the rows of the last batches, which the next pass removes again, and a
// claim that commits after the batch flushes the batch's commit with its
// own. Waiting for the flush made the cleaner wait on the disk once a
// batch, for about a quarter of its time.
const sqlCleanupBatch = `
WITH async AS (SELECT set_config('synchronous_commit', 'off', true)),
gone AS (
	DELETE FROM {{TABLE}} t
	USING (
		SELECT tableoid, ctid FROM {{TABLE}}
		WHERE ` + purgeable + ` AND purge_at >= $2
		ORDER BY purge_at
		LIMIT $1
		FOR UPDATE SKIP LOCKED) d
	WHERE t.tableoid = d.tableoid AND t.ctid = d.ctid
	RETURNING t.purge_at
)
SELECT count(*), coalesce(max(purge_at), $2) FROM gone, async`

// sqlCleanupLag is how far cleanup is behind, in seconds: the age of the
// oldest purge time of a purgeable row. 0 when none is left.
const sqlCleanupLag = `
SELECT coalesce(extract(epoch FROM now() - (
	SELECT purge_at FROM {{TABLE}} WHERE ` + purgeable + ` ORDER BY purge_at LIMIT 1)), 0)::float8`

// deferredMarker is the text a deferred claim's statements fail to cast
// when they do not take the key (SQLSTATE 22P02).
const deferredMarker = "oncemill: the key is held or has a record"

// newTokenFromSequence gives a claim of the partitioned layout decided up
// front the sequence's next token; firstTokenLiteral gives claimtx.Token
// to an insert the caller need not read the token back from: a deferred
// claim's, and the DELETE layout's sqlClaimNew. A one-transaction record
// exists only once its transaction commits, so no earlier holder of the
// key can still be fenced by the same token.
var (
	newTokenFromSequence = strings.NewReplacer("{{NEW_TOKEN}}", "nextval({{SEQ_LITERAL}})")
	firstTokenLiteral    = strings.NewReplacer("{{NEW_TOKEN}}", fmt.Sprint(claimtx.Token))
)

// A deferred claim of a new key that no lookup in other partitions guards
// (sqlClaimNewDeferred, sqlPartClaimNewCurrentDeferred) is a plain INSERT ..
// VALUES that fails when it does not take the key: the key's lock, tried
// first, leaves a NOT NULL column NULL when another claim holds it (SQLSTATE
// 23502), the unique index refuses a key that has a row (23505), and in
// the partitioned layout the partition's range refuses a clock outside it
// (23514). A failed statement aborts the transaction, which is what a
// refused deferred claim has to do, so the insert needs no ON CONFLICT
// arbiter (a second probe of the unique index), no INSERT .. SELECT and no
// CTE to turn "nothing inserted" into a failure (deferredForm), each of
// which PostgreSQL pays for on every claim.

// sqlClaimNewDeferred is sqlClaimNew's deferred form: the token is NULL
// when the key's lock ($6) is held. Parameters as sqlClaimNew's.
const sqlClaimNewDeferred = `
INSERT INTO {{TABLE}} (scope, key, fingerprint, status, token, attempt, taken_over,
	expires_at, purge_at, created_at, updated_at, message_uuid)
VALUES ($1::text, $2::text, $3::text, {{SUCCEEDED}}, CASE WHEN pg_try_advisory_xact_lock({{CLAIM_LOCK}}, $6) THEN {{NEW_TOKEN}} END, 1, false,
	now() + $4::int8 * interval '1 microsecond', now() + $5::int8 * interval '1 microsecond', now(), now(), $7::text)`

// statements are the store's SQL with its names filled in.
type statements struct {
	begin, claimNew, claimDeferred, claim, commitResult, recordRollback, complete, extend, release, releaseDelete,
	get, list, del, cleanupBatch, cleanupLag string
	// completeMove, releaseMove and extendMove are the partitioned
	// layout's second form of Complete, Release and Extend, for a row the
	// first did not find (partMove); "" in the DELETE layout.
	completeMove, releaseMove, extendMove string
}

func newStatements(n names, async bool) statements {
	begin := beginForm
	if async {
		begin = asyncBeginForm
	}
	q := statements{
		// The forms leave placeholders of their own, which render fills in.
		begin:          n.render(begin.Replace(sqlClaim)),
		claimNew:       n.render(firstTokenLiteral.Replace(sqlClaimNew)),
		claimDeferred:  n.render(firstTokenLiteral.Replace(sqlClaimNewDeferred)),
		claim:          n.render(claimForm.Replace(sqlClaim)),
		commitResult:   n.render(sqlCommitResult),
		recordRollback: n.render(sqlRecordRollback),
		complete:       n.render(sqlComplete),
		extend:         n.render(sqlExtend),
		release:        n.render(sqlRelease),
		releaseDelete:  n.render(sqlReleaseDelete),
		get:            n.render(sqlGet),
		list:           n.render(sqlList),
		del:            n.render(sqlDelete),
		cleanupBatch:   n.render(sqlCleanupBatch),
		cleanupLag:     n.render(sqlCleanupLag),
	}
	return q
}
