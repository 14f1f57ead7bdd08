// Package watermark is the PostgreSQL store's watermark mode on Kafka
// (store.KafkaWatermarks, docs/kafka.md). A Watermill Kafka subscriber
// hands a partition's messages over one at a time, the next only after the
// previous one was acked, and acks only after the router published what the
// handler produced. So one row per (group, topic, partition) holding the
// next offset to process tells every redelivery from new work: the claim,
// sent with BEGIN as the key mode's is, locks the row (inserting it if
// absent) and either moves the watermark past the message's offset, in the
// handler's transaction, or finds the offset below it: a duplicate, acked
// without running. Only the last committed message can have unpublished
// produced messages (a crash between the commit and the publish), so the
// row keeps that message's produced messages, which its redelivery replays
// with their UUIDs. A rolled-back transaction leaves the watermark where it
// was. The row never multiplies: the table holds one row per partition,
// however many messages went through. A process that committed a
// partition's previous message skips this claim and claims at the commit
// instead (fast.go).
//
// A failure cached by the policy (or whose attempts ran out) moves the
// watermark past its offset in a transaction of its own and becomes the
// row's last outcome: its redelivery is answered with the cached failure,
// as the key mode's would be. A retryable failure records the attempt count
// of the offset at the watermark, so that the policy's attempt cap counts
// across deliveries.
package watermark

import "strings"

// wmSet moves the watermark past offset $4 and records it as the last
// offset ($5: its message UUID), unless the offset is below the watermark
// ({{DUP}}) or the row holds its next attempt back ({{KEEP}}, which is
// {{DUP}} or wmHeld): then every column keeps its value but duplicate,
// set for a duplicate only (wmReturning tells the answers apart). The SET
// expressions read the row as it was before the statement. The claims store
// no result ({{RESULT}} NULL: the commit does) and clear retry_at when they
// execute (wmClearRetry). The fast path's commit (sqlWatermarkCommitFast)
// writes what an executing claim of a first attempt would, with a guard in
// place of the CASEs: a change here is a change there.
const wmSet = `
		duplicate = {{DUP}},
		next_offset = CASE WHEN {{KEEP}} THEN w.next_offset ELSE $4::int8 + 1 END,
		last_offset = CASE WHEN {{KEEP}} THEN w.last_offset ELSE $4::int8 END,
		last_status = CASE WHEN {{KEEP}} THEN w.last_status ELSE {{SUCCEEDED}} END,
		last_result = CASE WHEN {{KEEP}} THEN w.last_result ELSE {{RESULT}} END,
		last_error_kind = CASE WHEN {{KEEP}} THEN w.last_error_kind END,
		last_error_message = CASE WHEN {{KEEP}} THEN w.last_error_message END,
		last_message_uuid = CASE WHEN {{KEEP}} THEN w.last_message_uuid ELSE $5::text END,
		attempts = CASE WHEN {{KEEP}} THEN w.attempts WHEN w.attempt_offset = $4::int8 THEN w.attempts + 1 ELSE 1 END,
		attempt_offset = CASE WHEN {{KEEP}} THEN w.attempt_offset ELSE $4::int8 END,
		token = CASE WHEN {{KEEP}} THEN w.token ELSE w.token + 1 END,
		updated_at = CASE WHEN {{KEEP}} THEN w.updated_at ELSE now() END,
		contended = {{CONTENDED}}`

// wmReturning is what a claim returns: the row after it, and, for a
// held-back claim, the time left in microseconds (at least 1; NULL for the
// others). Held back is told from the row after the claim: an executing
// claim cleared retry_at, a duplicate set duplicate, and a held-back one
// kept every column.
const wmReturning = `
	RETURNING w.duplicate, w.next_offset, w.last_offset, w.last_status, w.last_result, coalesce(w.last_error_kind, ''),
		coalesce(w.last_error_message, ''), w.last_message_uuid, w.attempts, w.token, w.updated_at, w.contended,
		CASE WHEN NOT w.duplicate AND w.retry_at IS NOT NULL THEN greatest(ceil(extract(epoch FROM w.retry_at - now()) * 1000000)::int8, 1) END`

// wmDup is the claim's test for a duplicate, on the row before the claim.
const wmDup = `($4::int8 < w.next_offset)`

// wmHeld is the claim's test for an offset whose next attempt the row
// holds back (store.Completion.RetryAfter, sqlWatermarkRetryable): retry_at
// belongs to the offset whose attempts the row counts, attempt_offset, and
// to no other. With wmKeep a held-back claim changes no column, and its
// transaction is rolled back: it is no attempt.
const wmHeld = `($4::int8 = w.attempt_offset AND w.retry_at > now())`

// wmKeep is {{KEEP}} of the claims: a duplicate or a held-back offset.
const wmKeep = `(` + wmDup + ` OR ` + wmHeld + `)`

// wmClearRetry follows wmSet in the claims: an executing claim clears
// retry_at, the others keep it.
const wmClearRetry = `,
		retry_at = CASE WHEN {{KEEP}} THEN w.retry_at END`

// wmContended tells whether the claim waited for another owner: the row it
// updates is not the version its statement's snapshot saw (lt.seen), so
// another transaction committed it meanwhile, the claim having waited for
// its lock (or met it just committed). A claim of a new partition that
// finds the row inserted meanwhile is contended too (sqlWatermarkClaimNew).
const wmContended = `(w.xmin::text IS DISTINCT FROM lt.seen)`

// lockTimeout sets lock_timeout to $6 milliseconds for the statement's
// row lock, and the final SELECT puts it back (claimForm's way): the
// handler's own statements keep the session's value. MATERIALIZED makes
// it run before the row is locked.
const wmLockTimeout = `lt AS MATERIALIZED (SELECT current_setting('lock_timeout') AS prior, set_config('lock_timeout', ($6::int8)::text, true),
	(SELECT s.xmin::text FROM {{WATERMARKS}} AS s WHERE s.group_id = $1 AND s.topic = $2 AND s.partition = $3) AS seen)`

// sqlWatermarkClaim is the watermark mode's claim, the first statement of
// the handler's transaction, sent with its BEGIN: $1 group, $2 topic, $3
// partition, $4 offset, $5 message UUID, $6 the lock wait in milliseconds.
// It updates the partition's row (locking it, waiting for another owner's
// open transaction, and then seeing what that one committed) and returns
// its values, with duplicate telling the two answers apart; for a
// duplicate every other column keeps its value, and the caller rolls the
// transaction back. Offsets may have gaps (compaction, transaction
// markers): any offset at or above the watermark executes. A plain UPDATE
// rather than an upsert: ON CONFLICT locks the row with a write of its own
// before it updates it. It returns no row for a partition without one:
// sqlWatermarkClaimNew then inserts it in the same transaction.
const sqlWatermarkClaim = `
WITH ` + wmLockTimeout + `,
up AS (
	UPDATE {{WATERMARKS}} AS w SET` + wmSet + wmClearRetry + `
	FROM lt
	WHERE w.group_id = $1 AND w.topic = $2 AND w.partition = $3` + wmReturning + `
)
SELECT up.*, set_config('lock_timeout', lt.prior, true) FROM up CROSS JOIN lt`

// sqlWatermarkClaimNew is the claim of a partition without a row (its first
// message): it inserts the row, or, when another owner inserted it
// meanwhile, locks and updates it as sqlWatermarkClaim does.
const sqlWatermarkClaimNew = `
WITH ` + wmLockTimeout + `,
up AS (
	INSERT INTO {{WATERMARKS}} AS w (group_id, topic, partition, next_offset, last_offset, last_status, last_result,
		last_error_kind, last_error_message, last_message_uuid, attempt_offset, attempts, token, duplicate, updated_at, contended)
	SELECT $1::text, $2::text, $3::int4, $4::int8 + 1, $4::int8, {{SUCCEEDED}}, NULL, NULL, NULL, $5::text, $4::int8, 1, 1, false, now(), false
	FROM lt
	ON CONFLICT (group_id, topic, partition) DO UPDATE SET` + wmSet + wmClearRetry + wmReturning + `
)
SELECT up.*, set_config('lock_timeout', lt.prior, true) FROM up CROSS JOIN lt`

// sqlWatermarkCommitResult, sent with COMMIT in one round trip, stores the
// produced messages of the success the claim recorded.
const sqlWatermarkCommitResult = `
UPDATE {{WATERMARKS}} SET last_result = $4
WHERE group_id = $1 AND topic = $2 AND partition = $3`

// sqlWatermarkRetryable records, after a rolled-back attempt, the attempt
// count of offset $4 ($5) and the pause before its next attempt, $6
// microseconds from now() of the database (retry_at, NULL for none; see
// wmHeld), in one statement, unless the watermark moved past the offset
// meanwhile. It writes retry_at whatever it held: the row's retry_at is
// always the offset's it counts. A partition without a row gets one whose
// watermark is the offset.
const sqlWatermarkRetryable = `
INSERT INTO {{WATERMARKS}} AS w (group_id, topic, partition, next_offset, last_offset, last_status,
	last_message_uuid, attempt_offset, attempts, token, updated_at, retry_at)
VALUES ($1::text, $2::text, $3::int4, $4::int8, -1, {{SUCCEEDED}}, '', $4::int8, $5::int4, 0, now(), ` + wmRetryAt + `)
ON CONFLICT (group_id, topic, partition) DO UPDATE SET
	attempts = greatest(CASE WHEN w.attempt_offset = $4::int8 THEN w.attempts ELSE 0 END, $5::int4),
	attempt_offset = $4::int8,
	updated_at = now(),
	retry_at = excluded.retry_at
WHERE w.next_offset <= $4::int8`

// wmRetryAt is the retry_at sqlWatermarkRetryable writes.
const wmRetryAt = `CASE WHEN $6::int8 > 0 THEN now() + $6::int8 * interval '1 microsecond' END`

// sqlWatermarkFailed caches the failure of offset $4: the watermark moves
// past it and the failure becomes the row's last outcome ($7 kind, $8
// message), which its redelivery replays; retry_at is cleared. Unless the
// watermark moved past it meanwhile.
const sqlWatermarkFailed = `
INSERT INTO {{WATERMARKS}} AS w (group_id, topic, partition, next_offset, last_offset, last_status, last_result,
	last_error_kind, last_error_message, last_message_uuid, attempt_offset, attempts, token, updated_at)
VALUES ($1::text, $2::text, $3::int4, $4::int8 + 1, $4::int8, {{FAILED}}, NULL, $7::text, $8::text, $6::text, $4::int8, $5::int4, 1, now())
ON CONFLICT (group_id, topic, partition) DO UPDATE SET
	next_offset = $4::int8 + 1,
	last_offset = $4::int8,
	last_status = {{FAILED}},
	last_result = NULL,
	last_error_kind = $7::text,
	last_error_message = $8::text,
	last_message_uuid = $6::text,
	attempts = greatest(CASE WHEN w.attempt_offset = $4::int8 THEN w.attempts ELSE 0 END, $5::int4),
	attempt_offset = $4::int8,
	token = w.token + 1,
	updated_at = now(),
	retry_at = NULL
WHERE w.next_offset <= $4::int8`

// sqlWatermarks lists the rows, for operators.
const sqlWatermarks = `
SELECT group_id, topic, partition, next_offset, last_offset, last_status, last_message_uuid,
	coalesce(last_error_kind, ''), attempt_offset, attempts, updated_at
FROM {{WATERMARKS}}
WHERE ($1::text = '' OR group_id = $1::text) AND ($2::text = '' OR topic = $2::text)
ORDER BY group_id, topic, partition`

// sqlMoveWatermark sets a partition's watermark to $4, creating its row if
// absent. The attempt count starts again, and nothing holds the offset
// back (retry_at). MoveWatermark reads the old
// watermark first, under the row's lock (sqlLockWatermark), in the same
// transaction.
const sqlMoveWatermark = `
INSERT INTO {{WATERMARKS}} AS w (group_id, topic, partition, next_offset, last_offset, last_status,
	last_message_uuid, attempt_offset, attempts, token, updated_at)
VALUES ($1::text, $2::text, $3::int4, $4::int8, -1, {{SUCCEEDED}}, '', $4::int8, 0, 0, now())
ON CONFLICT (group_id, topic, partition) DO UPDATE SET
	next_offset = $4::int8, attempt_offset = $4::int8, attempts = 0, updated_at = now(), retry_at = NULL`

// sqlDeleteWatermark removes a partition's row and returns its watermark.
const sqlDeleteWatermark = `
DELETE FROM {{WATERMARKS}} WHERE group_id = $1 AND topic = $2 AND partition = $3 RETURNING next_offset`

const sqlLockWatermark = `
SELECT next_offset FROM {{WATERMARKS}} WHERE group_id = $1 AND topic = $2 AND partition = $3 FOR UPDATE`

// sqlWatermarkCommitFast is the fast path's claim, sent with COMMIT: $1
// group, $2 topic, $3 partition, $4 offset, $5 message UUID, $6 produced
// messages. It moves the watermark past the offset and records it as the
// last one, as an executing claim with its first attempt would, if the
// row is what a clean commit of an earlier offset left: the watermark at
// or below the offset, the last outcome a success, and no attempt of the
// offset counted (attempt_offset below it: no retryable failure, no pause,
// no move to it). It waits for the row's lock if another owner holds it,
// and returns the row's new token. Anything else updates no row, and the
// statement fails casting wmMovedMarker to a number (SQLSTATE 22P02, the
// marker in the message): the error aborts the transaction on the server,
// and the stage claims again the pessimistic way, which decides from the
// row. One plain statement rather than a PL/pgSQL function that raises a
// code of its own: the function's call cost 1-4% of the benchmark's
// throughput.
//
// Under that guard it sets only what differs from the row after an
// executing claim (wmSet), so no CASE: last_status is already a success,
// and then last_error_kind and last_error_message are NULL (no statement
// writes a success with them set); attempts is 1 and attempt_offset the
// offset, as a first attempt's; duplicate and contended are scratch every
// claim sets before it reads them. It leaves retry_at, which only holds
// back a claim of attempt_offset at or above the watermark (wmHeld): the
// statement moves attempt_offset to the offset and the watermark past it,
// and every statement that leaves attempt_offset at or above the watermark
// writes retry_at (sqlWatermarkRetryable, sqlMoveWatermark; a new row has
// none).
const sqlWatermarkCommitFast = `
WITH up AS (
	UPDATE {{WATERMARKS}} SET next_offset = $4::int8 + 1, last_offset = $4::int8, last_result = $6::bytea,
		last_message_uuid = $5::text, attempt_offset = $4::int8, attempts = 1, token = token + 1, updated_at = now()
	WHERE group_id = $1 AND topic = $2 AND partition = $3
		AND next_offset <= $4::int8 AND attempt_offset < $4::int8 AND last_status = {{SUCCEEDED}}
	RETURNING token
)
SELECT coalesce((SELECT token::text FROM up), '` + wmMovedMarker + `')::int8`

// wmMovedMarker is the text sqlWatermarkCommitFast fails to cast.
const wmMovedMarker = "oncemill: the watermark moved past the offset"

// Statements are the mode's SQL with the store's names.
type Statements struct {
	claim, claimNew, commitResult, commitFast, retryable, failed string
	// List, Lock, Move and Delete serve operators (store/postgres's
	// Watermarks, MoveWatermark and DeleteWatermark): List all rows, $1
	// group and $2 topic when not empty; Lock a row's next offset ($1
	// group, $2 topic, $3 partition); Move its watermark to $4, creating
	// the row if absent; Delete the row, returning its next offset.
	List, Lock, Move, Delete string
}

// NewStatements renders the mode's SQL with render, which fills in the
// store's names ({{WATERMARKS}}) and codes ({{SUCCEEDED}}, {{FAILED}}).
func NewStatements(render func(string) string) Statements {
	r := render
	return Statements{
		claim:        r(strings.NewReplacer("{{DUP}}", wmDup, "{{KEEP}}", wmKeep, "{{CONTENDED}}", wmContended, "{{RESULT}}", "NULL").Replace(sqlWatermarkClaim)),
		claimNew:     r(strings.NewReplacer("{{DUP}}", wmDup, "{{KEEP}}", wmKeep, "{{CONTENDED}}", "true", "{{RESULT}}", "NULL").Replace(sqlWatermarkClaimNew)),
		commitResult: r(sqlWatermarkCommitResult),
		commitFast:   r(sqlWatermarkCommitFast),
		retryable:    r(sqlWatermarkRetryable),
		failed:       r(sqlWatermarkFailed),
		List:         r(sqlWatermarks),
		Lock:         r(sqlLockWatermark),
		Move:         r(sqlMoveWatermark),
		Delete:       r(sqlDeleteWatermark),
	}
}

// ByName are the statements of the delivery path, of a move and of a
// delete, by name, for the tests of their plans.
func (q Statements) ByName() map[string]string {
	return map[string]string{
		"wmClaim": q.claim, "wmClaimNew": q.claimNew, "wmCommitResult": q.commitResult, "wmCommitFast": q.commitFast, "wmRetryable": q.retryable, "wmFailed": q.failed,
		"wmLock": q.Lock, "wmMove": q.Move, "wmDelete": q.Delete,
	}
}
