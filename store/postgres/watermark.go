package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncemill/oncemill/internal/kafkapos"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/lazytx"
)

// The watermark mode on Kafka (store.KafkaWatermarks, docs/kafka.md). A
// Watermill Kafka subscriber hands a partition's messages over one at a
// time, the next only after the previous one was acked, and acks only after
// the router published what the handler produced. So one row per (group,
// topic, partition) holding the next offset to process tells every
// redelivery from new work: the claim, sent with BEGIN as the key mode's
// is, locks the row (inserting it if absent) and either moves the
// watermark past the message's offset, in the handler's transaction, or
// finds the offset below it: a duplicate, acked without running. Only the
// last committed message can have unpublished produced messages (a crash
// between the commit and the publish), so the row keeps that message's
// produced messages, which its redelivery replays with their UUIDs. A
// rolled-back transaction leaves the watermark where it was. The row never
// multiplies: the table holds one row per partition, however many messages
// went through. A process that committed a partition's previous message
// skips this claim and claims at the commit instead (watermark_fast.go).
//
// A failure cached by the policy (or whose attempts ran out) moves the
// watermark past its offset in a transaction of its own and becomes the
// row's last outcome: its redelivery is answered with the cached failure,
// as the key mode's would be. A retryable failure records the attempt count
// of the offset at the watermark, so that the policy's attempt cap counts
// across deliveries.

// wmSet moves the watermark past offset $4 and records it as the last
// offset ($5: its message UUID), unless the offset is below the watermark:
// then every column keeps its value but duplicate, which tells the caller.
// The SET expressions read the row as it was before the statement. The
// claims store no result ({{RESULT}} NULL: the commit does); the fast
// path's commit (watermark_fast.go) uses it with {{DUP}} false, storing
// its produced messages.
const wmSet = `
		duplicate = {{DUP}},
		next_offset = CASE WHEN {{DUP}} THEN w.next_offset ELSE $4::int8 + 1 END,
		last_offset = CASE WHEN {{DUP}} THEN w.last_offset ELSE $4::int8 END,
		last_status = CASE WHEN {{DUP}} THEN w.last_status ELSE {{SUCCEEDED}} END,
		last_result = CASE WHEN {{DUP}} THEN w.last_result ELSE {{RESULT}} END,
		last_error_kind = CASE WHEN {{DUP}} THEN w.last_error_kind END,
		last_error_message = CASE WHEN {{DUP}} THEN w.last_error_message END,
		last_message_uuid = CASE WHEN {{DUP}} THEN w.last_message_uuid ELSE $5::text END,
		attempts = CASE WHEN {{DUP}} THEN w.attempts WHEN w.attempt_offset = $4::int8 THEN w.attempts + 1 ELSE 1 END,
		attempt_offset = CASE WHEN {{DUP}} THEN w.attempt_offset ELSE $4::int8 END,
		token = CASE WHEN {{DUP}} THEN w.token ELSE w.token + 1 END,
		updated_at = CASE WHEN {{DUP}} THEN w.updated_at ELSE now() END,
		contended = {{CONTENDED}}`

// wmReturning is what a claim returns: the row after it.
const wmReturning = `
	RETURNING w.duplicate, w.next_offset, w.last_offset, w.last_status, w.last_result, coalesce(w.last_error_kind, ''),
		coalesce(w.last_error_message, ''), w.last_message_uuid, w.attempts, w.token, w.updated_at, w.contended`

// wmDup is the claim's test for a duplicate, on the row before the claim.
const wmDup = `($4::int8 < w.next_offset)`

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
	UPDATE {{WATERMARKS}} AS w SET` + wmSet + `
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
	ON CONFLICT (group_id, topic, partition) DO UPDATE SET` + wmSet + wmReturning + `
)
SELECT up.*, set_config('lock_timeout', lt.prior, true) FROM up CROSS JOIN lt`

// sqlWatermarkCommitResult, sent with COMMIT in one round trip, stores the
// produced messages of the success the claim recorded.
const sqlWatermarkCommitResult = `
UPDATE {{WATERMARKS}} SET last_result = $4
WHERE group_id = $1 AND topic = $2 AND partition = $3`

// sqlWatermarkRetryable records, after a rolled-back attempt, the attempt
// count of offset $4 ($5), unless the watermark moved past it meanwhile. A
// partition without a row gets one whose watermark
// is the offset.
const sqlWatermarkRetryable = `
INSERT INTO {{WATERMARKS}} AS w (group_id, topic, partition, next_offset, last_offset, last_status,
	last_message_uuid, attempt_offset, attempts, token, updated_at)
VALUES ($1::text, $2::text, $3::int4, $4::int8, -1, {{SUCCEEDED}}, '', $4::int8, $5::int4, 0, now())
ON CONFLICT (group_id, topic, partition) DO UPDATE SET
	attempts = greatest(CASE WHEN w.attempt_offset = $4::int8 THEN w.attempts ELSE 0 END, $5::int4),
	attempt_offset = $4::int8,
	updated_at = now()
WHERE w.next_offset <= $4::int8`

// sqlWatermarkFailed caches the failure of offset $4: the watermark moves
// past it and the failure becomes the row's last outcome ($7 kind, $8
// message), which its redelivery replays. Unless the watermark moved past
// it meanwhile.
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
	updated_at = now()
WHERE w.next_offset <= $4::int8`

// sqlWatermarks lists the rows, for operators.
const sqlWatermarks = `
SELECT group_id, topic, partition, next_offset, last_offset, last_status, last_message_uuid,
	coalesce(last_error_kind, ''), attempt_offset, attempts, updated_at
FROM {{WATERMARKS}}
WHERE ($1::text = '' OR group_id = $1::text) AND ($2::text = '' OR topic = $2::text)
ORDER BY group_id, topic, partition`

// sqlMoveWatermark sets a partition's watermark to $4, creating its row if
// absent. The attempt count starts again. MoveWatermark reads the old
// watermark first, under the row's lock (sqlLockWatermark), in the same
// transaction.
const sqlMoveWatermark = `
INSERT INTO {{WATERMARKS}} AS w (group_id, topic, partition, next_offset, last_offset, last_status,
	last_message_uuid, attempt_offset, attempts, token, updated_at)
VALUES ($1::text, $2::text, $3::int4, $4::int8, -1, {{SUCCEEDED}}, '', $4::int8, 0, 0, now())
ON CONFLICT (group_id, topic, partition) DO UPDATE SET
	next_offset = $4::int8, attempt_offset = $4::int8, attempts = 0, updated_at = now()`

const sqlLockWatermark = `
SELECT next_offset FROM {{WATERMARKS}} WHERE group_id = $1 AND topic = $2 AND partition = $3 FOR UPDATE`

// watermarkStatements are the mode's SQL with the store's names.
type watermarkStatements struct {
	claim, claimNew, commitResult, commitFast, retryable, failed, list, lock, move string
}

func newWatermarkStatements(n names) watermarkStatements {
	r := n.render
	return watermarkStatements{
		claim:        r(strings.NewReplacer("{{DUP}}", wmDup, "{{CONTENDED}}", wmContended, "{{RESULT}}", "NULL").Replace(sqlWatermarkClaim)),
		claimNew:     r(strings.NewReplacer("{{DUP}}", wmDup, "{{CONTENDED}}", "true", "{{RESULT}}", "NULL").Replace(sqlWatermarkClaimNew)),
		commitResult: r(sqlWatermarkCommitResult),
		commitFast:   r(strings.NewReplacer("{{DUP}}", "false", "{{CONTENDED}}", "false", "{{RESULT}}", "$6::bytea").Replace(sqlWatermarkCommitFast)),
		retryable:    r(sqlWatermarkRetryable),
		failed:       r(sqlWatermarkFailed),
		list:         r(sqlWatermarks),
		lock:         r(sqlLockWatermark),
		move:         r(sqlMoveWatermark),
	}
}

// errWatermarkConfig: the watermark mode was asked for without a consumer
// group, or without the high-water mark it checks a watermark against.
var errWatermarkConfig = fmt.Errorf("oncemill: postgres: kafka watermarks: %w", store.ErrInvalidRequest)

// KafkaWatermarks implements store.KafkaWatermarks: the one-transaction
// claims of the watermark mode for the consumer group group, on the table
// <Table>_watermarks that Migrate creates. Use it through
// receiver.NewTransactional(st).WithKafkaWatermark, which builds it.
func (s *Store) KafkaWatermarks(group string, highWaterMark func(ctx context.Context, topic string, partition int32) (int64, error)) (store.Transactional, error) {
	switch {
	case group == "":
		return nil, fmt.Errorf("%w: the consumer group is empty; the watermarks follow a group's progress: pass the subscriber's ConsumerGroup", errWatermarkConfig)
	case highWaterMark == nil:
		return nil, fmt.Errorf("%w: HighWaterMark is nil; pass a function that asks Kafka for a partition's high-water mark (kafkakeys.HighWaterMark)", errWatermarkConfig)
	}
	if err := checkText("kafka watermarks", "group", group); err != nil {
		return nil, err
	}
	return &watermarks{s: s, group: group, highWaterMark: highWaterMark}, nil
}

// watermarks is the mode's store.Transactional over a Store.
type watermarks struct {
	s             *Store
	group         string
	highWaterMark func(ctx context.Context, topic string, partition int32) (int64, error)
	// checked holds the partitions (topic, partition) whose watermark was
	// found at or below the high-water mark by this process.
	checked sync.Map
	// cache holds the watermarks this process committed last, for the fast
	// path (watermark_fast.go).
	cache wmCache
}

var _ store.Transactional = (*watermarks)(nil)

func (w *watermarks) Limits() store.Limits { return w.s.Limits() }

// ClaimInTx implements store.Transactional: req.Key is a position
// (internal/kafkapos); Scope and Fingerprint are not stored.
func (w *watermarks) ClaimInTx(ctx context.Context, req store.TxRequest) (store.TxResult, error) {
	pos, err := kafkapos.Parse(req.Key)
	if err != nil {
		return store.TxResult{}, fmt.Errorf("oncemill: postgres: watermark claim: %w", err)
	}
	if req.Wait <= 0 {
		return store.TxResult{}, invalid("watermark claim", "wait %v must be positive", req.Wait)
	}
	if err := checkText("watermark claim", "topic", pos.Topic); err != nil {
		return store.TxResult{}, err
	}
	s := w.s
	uuid := storableText(req.MessageUUID, maxMessageUUIDLen)
	ctx, cancel, err := s.enter(ctx, "watermark claim", req.Wait)
	if err != nil {
		return store.TxResult{}, err
	}
	defer s.leave(cancel)
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return store.TxResult{}, wrap("watermark claim", err)
	}
	if known, ok := w.cache.take(wmPart(pos), pos.Offset); ok { // the fast path (watermark_fast.go)
		t := &claimTx{s: s, conn: conn, scope: req.Scope, key: req.Key,
			wm: &wmCommit{group: w.group, pos: pos, uuid: uuid, cache: &w.cache}}
		t.lazy = lazytx.New(conn, s.opts.TxOptions, s.opts.StatementTimeout, nil)
		t.handler = newHandlerTx(t.lazy, t, true)
		claim := store.Claim{Scope: req.Scope, Key: req.Key, Token: known.token + 1, Attempt: 1, MessageUUID: uuid}
		return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionExecute, Claim: claim}, Tx: t}, nil
	}
	args := []any{w.group, pos.Topic, pos.Partition, pos.Offset, uuid, max(req.Wait.Milliseconds(), 1)}
	b := &pgx.Batch{}
	b.BeginTx(s.opts.TxOptions)
	b.Queue(s.wm.claim, args...)
	br := conn.SendBatch(ctx, b)
	var row wmRow
	if _, err = br.Exec(); err == nil {
		err = row.scan(br.QueryRow())
	}
	if cerr := br.Close(); err == nil || errors.Is(err, pgx.ErrNoRows) && cerr != nil {
		err = cerr
	}
	tx := br.Tx()
	if errors.Is(err, pgx.ErrNoRows) { // the partition's first message: no row yet
		err = row.scan(tx.QueryRow(ctx, s.wm.claimNew, args...))
	}
	if err == nil && !row.duplicate {
		t := &claimTx{s: s, conn: conn, scope: req.Scope, key: req.Key,
			wm: &wmCommit{group: w.group, pos: pos, uuid: uuid, cache: &w.cache, token: row.token}}
		t.handler = newHandlerTx(tx, t, true)
		claim := store.Claim{Scope: req.Scope, Key: req.Key, Token: row.token, Attempt: int(row.attempts), MessageUUID: uuid}
		return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionExecute, Claim: claim}, Tx: t, Contended: row.contended}, nil
	}
	rollback(ctx, conn) // a duplicate changed nothing, and keeps no connection
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable:
		return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionHeld}, Contended: true}, nil
	case err != nil:
		return store.TxResult{}, wrap("watermark claim", err)
	}
	if err := w.checkAhead(ctx, pos, row.next); err != nil {
		return store.TxResult{}, err
	}
	return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionReplay, Record: row.record(req, pos)}, Contended: row.contended}, nil
}

// checkAhead compares the partition's watermark with its high-water mark,
// once per partition and process, the first time a duplicate comes: a
// watermark above it means the partition's offsets started again, and
// every message would be acked as a duplicate. The check is left undone
// while it fails, so that it fails again.
func (w *watermarks) checkAhead(ctx context.Context, pos store.KafkaPosition, watermark int64) error {
	part := wmPart(pos)
	if _, ok := w.checked.Load(part); ok {
		return nil
	}
	hwm, err := w.highWaterMark(ctx, pos.Topic, pos.Partition)
	if err != nil {
		return fmt.Errorf("oncemill: postgres: watermark claim: reading the high-water mark of %s partition %d: %w", pos.Topic, pos.Partition, err)
	}
	if watermark > hwm {
		return fmt.Errorf("oncemill: postgres: watermark claim: group %q topic %q partition %d: watermark %d, high-water mark %d: %w; "+
			"the topic was probably recreated, and every message would be acked unrun as a duplicate, so none is decided. "+
			"Check, then move the watermark to where processing must start: oncemill watermark move --group %s --topic %s --partition %d --offset 0 --force",
			w.group, pos.Topic, pos.Partition, watermark, hwm, store.ErrWatermarkAhead, w.group, pos.Topic, pos.Partition)
	}
	w.checked.Store(part, struct{}{})
	return nil
}

// RecordRollback implements store.Transactional: a cached failure moves the
// watermark past the offset and becomes the row's last outcome; a
// retryable one records the offset's attempt count.
func (w *watermarks) RecordRollback(ctx context.Context, lease store.Claim, _ string, out store.Completion) error {
	pos, err := kafkapos.Parse(lease.Key)
	if err != nil {
		return fmt.Errorf("oncemill: postgres: watermark record rollback: %w", err)
	}
	uuid := storableText(lease.MessageUUID, maxMessageUUIDLen)
	ctx, cancel, err := w.s.enter(ctx, "watermark record rollback", 0)
	if err != nil {
		return err
	}
	defer w.s.leave(cancel)
	var tag pgconn.CommandTag
	switch out.Status {
	case store.StatusRetryable:
		tag, err = w.s.pool.Exec(ctx, w.s.wm.retryable, w.group, pos.Topic, pos.Partition, pos.Offset, lease.Attempt)
	case store.StatusCachedFailure:
		tag, err = w.s.pool.Exec(ctx, w.s.wm.failed, w.group, pos.Topic, pos.Partition, pos.Offset, lease.Attempt, uuid,
			storableText(string(out.ErrorKind), maxErrorKindLen), storableText(out.ErrorMessage, maxErrorMessageLen))
	default:
		return invalid("watermark record rollback", "outcome status must be failed or retryable, not %v", out.Status)
	}
	if err != nil {
		return wrap("watermark record rollback", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("oncemill: postgres: watermark record rollback %s: the watermark moved past the offset: %w", lease.Key, store.ErrLeaseLost)
	}
	return nil
}

// wmCommit is what a watermark claim's Commit writes the produced messages
// into, and the partition's entry in the process's cache that a clean
// commit puts back.
type wmCommit struct {
	group string
	pos   store.KafkaPosition
	uuid  string
	cache *wmCache
	// token is the pessimistic claim's (the row's after it); the fast
	// path's commit reads it from the row.
	token int64
}

// wmRow is the claim's answer.
type wmRow struct {
	duplicate               bool
	next, lastOffset        int64
	lastStatus              int16
	lastResult              []byte
	errorKind, errorMessage string
	lastUUID                string
	attempts                int32
	token                   int64
	updatedAt               time.Time
	contended               bool
}

// scan reads a claim's row (and the lock_timeout put back, dropped).
func (r *wmRow) scan(row pgx.Row) error {
	return row.Scan(&r.duplicate, &r.next, &r.lastOffset, &r.lastStatus, &r.lastResult, &r.errorKind,
		&r.errorMessage, &r.lastUUID, &r.attempts, &r.token, &r.updatedAt, &r.contended, nil)
}

// record is a duplicate's answer: the last outcome, produced messages or
// failure, for the last message that committed or cached one; a success
// with nothing to replay for an older offset, whose produced messages were
// published before the next message could be handed over.
func (r *wmRow) record(req store.TxRequest, pos store.KafkaPosition) *store.Record {
	rec := &store.Record{Scope: req.Scope, Key: req.Key, Status: store.StatusSucceeded, Token: r.token, Attempt: int(r.attempts),
		CreatedAt: r.updatedAt, UpdatedAt: r.updatedAt, ExpiresAt: r.updatedAt.Add(100 * 365 * 24 * time.Hour)}
	if pos.Offset == r.lastOffset {
		rec.Status = store.Status(r.lastStatus)
		rec.Result = r.lastResult
		rec.ErrorKind = store.ErrorKind(r.errorKind)
		rec.ErrorMessage = r.errorMessage
		rec.MessageUUID = r.lastUUID
	}
	return rec
}

// Watermark is one partition's row of the watermark mode, for operators
// (Store.Watermarks, "oncemill watermark show").
type Watermark struct {
	Group     string
	Topic     string
	Partition int32
	// Next is the watermark: the next offset to process. Lower offsets are
	// acked as duplicates.
	Next int64
	// LastOffset is the last offset that committed or cached a failure
	// (-1: none yet), LastStatus its outcome, LastMessageUUID its message.
	LastOffset      int64
	LastStatus      store.Status
	LastErrorKind   store.ErrorKind
	LastMessageUUID string
	// Attempts counts the failed attempts of AttemptOffset.
	AttemptOffset int64
	Attempts      int
	UpdatedAt     time.Time
}

// Watermarks returns the watermark mode's rows, those of group and topic
// when not empty, ordered by group, topic and partition.
func (s *Store) Watermarks(ctx context.Context, group, topic string) ([]Watermark, error) {
	ctx, cancel, err := s.enter(ctx, "watermarks", 0)
	if err != nil {
		return nil, err
	}
	defer s.leave(cancel)
	rows, err := s.pool.Query(ctx, s.wm.list, group, topic)
	if err != nil {
		return nil, wrap("watermarks", err)
	}
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Watermark, error) {
		var w Watermark
		var status int16
		var kind string
		var attempts int32
		err := row.Scan(&w.Group, &w.Topic, &w.Partition, &w.Next, &w.LastOffset, &status, &w.LastMessageUUID, &kind, &w.AttemptOffset, &attempts, &w.UpdatedAt)
		w.LastStatus, w.LastErrorKind, w.Attempts = store.Status(status), store.ErrorKind(kind), int(attempts)
		return w, err
	})
	if err != nil {
		return nil, wrap("watermarks", err)
	}
	return out, nil
}

// MoveWatermark sets the watermark of (group, topic, partition) to offset,
// creating the row if there is none, and returns the watermark it had
// (existed false when there was no row). Moving it back makes the offsets
// from offset on run again; moving it forward acks the skipped ones unrun.
// It is for operators: a topic recreated, a range to process again on
// purpose.
func (s *Store) MoveWatermark(ctx context.Context, group, topic string, partition int32, offset int64) (previous int64, existed bool, err error) {
	if group == "" || topic == "" || partition < 0 || offset < 0 {
		return 0, false, invalid("move watermark", "group %q, topic %q, partition %d, offset %d: give a group and a topic, and a partition and an offset of 0 or more", group, topic, partition, offset)
	}
	ctx, cancel, err := s.enter(ctx, "move watermark", 0)
	if err != nil {
		return 0, false, err
	}
	defer s.leave(cancel)
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		err := tx.QueryRow(ctx, s.wm.lock, group, topic, partition).Scan(&previous)
		switch {
		case err == nil:
			existed = true
		case !errors.Is(err, pgx.ErrNoRows):
			return err
		}
		_, err = tx.Exec(ctx, s.wm.move, group, topic, partition, offset)
		return err
	})
	if err != nil {
		return 0, false, wrap("move watermark", err)
	}
	return previous, existed, nil
}
