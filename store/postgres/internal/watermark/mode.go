package watermark

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/kafkapos"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/gate"
	"github.com/oncemill/oncemill/store/internal/requests"
	"github.com/oncemill/oncemill/store/postgres/internal/guardtx"
	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// Config is what the mode needs of its store.
type Config struct {
	Pool *pgxpool.Pool
	// Gate admits the mode's operations while the store is open.
	Gate      *gate.Gate
	SQL       Statements
	TxOptions pgx.TxOptions
	Limits    store.Limits
	// Group is the consumer group whose progress the watermarks follow.
	Group string
	// HighWaterMark asks Kafka for a partition's high-water mark.
	HighWaterMark func(ctx context.Context, topic string, partition int32) (int64, error)
}

// Mode is the watermark mode's store.Transactional for one consumer group.
type Mode struct {
	cfg Config
	// checked holds the partitions (topic, partition) whose watermark was
	// found at or below the high-water mark by this process.
	checked sync.Map
	// cache holds the watermarks this process committed last, for the fast
	// path (fast.go).
	cache wmCache
	// group is cfg.Group as a statement's argument, boxed once rather
	// than at each commit.
	group any
}

var _ store.Transactional = (*Mode)(nil)

// New returns the mode for cfg.Group.
func New(cfg Config) *Mode { return &Mode{cfg: cfg, group: cfg.Group} }

// Limits implements store.Transactional: the store's.
func (m *Mode) Limits() store.Limits { return m.cfg.Limits }

// ClaimInTx implements store.Transactional: req.Key is a position
// (internal/kafkapos); Scope and Fingerprint are not stored.
func (m *Mode) ClaimInTx(ctx context.Context, req store.TxRequest) (store.TxResult, error) {
	pos, err := kafkapos.Parse(req.Key)
	if err != nil {
		return store.TxResult{}, fmt.Errorf("oncemill: postgres: watermark claim: %w", err)
	}
	if req.Wait <= 0 {
		return store.TxResult{}, pgerr.Invalid("watermark claim", "wait %v must be positive", req.Wait)
	}
	if err := pgerr.CheckText("watermark claim", "topic", pos.Topic); err != nil {
		return store.TxResult{}, err
	}
	uuid := pgerr.StorableText(req.MessageUUID, pgerr.MaxMessageUUIDLen)
	ctx, cancel, err := m.cfg.Gate.Enter(ctx, "watermark claim", req.Wait)
	if err != nil {
		return store.TxResult{}, err
	}
	defer m.cfg.Gate.Leave(cancel)
	conn, err := m.cfg.Pool.Acquire(ctx)
	if err != nil {
		return store.TxResult{}, pgerr.Wrap("watermark claim", err)
	}
	if known, ok := m.cache.take(wmPart(pos), pos.Offset); ok { // the fast path (fast.go)
		t := m.newFastTx(conn, req.Key, pos, uuid)
		claim := store.Claim{Scope: req.Scope, Key: req.Key, Token: known.token + 1, Attempt: 1, MessageUUID: uuid}
		return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionExecute, Claim: claim}, Tx: t}, nil
	}
	args := []any{m.cfg.Group, pos.Topic, pos.Partition, pos.Offset, uuid, max(req.Wait.Milliseconds(), 1)}
	b := &pgx.Batch{}
	b.BeginTx(m.cfg.TxOptions)
	b.Queue(m.cfg.SQL.claim, args...)
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
		err = row.scan(tx.QueryRow(ctx, m.cfg.SQL.claimNew, args...))
	}
	if err == nil && !row.duplicate && row.retryIn == nil {
		t := m.newTx(conn, tx, req.Key, pos, uuid, row.token)
		claim := store.Claim{Scope: req.Scope, Key: req.Key, Token: row.token, Attempt: int(row.attempts), MessageUUID: uuid}
		return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionExecute, Claim: claim}, Tx: t, Contended: row.contended}, nil
	}
	guardtx.Release(ctx, conn) // a duplicate or a held-back offset changed nothing, and keeps no connection
	switch {
	case pgerr.Code(err) == pgerr.LockNotAvailable:
		return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionHeld}, Contended: true}, nil
	case err != nil:
		return store.TxResult{}, pgerr.Wrap("watermark claim", err)
	case row.retryIn != nil: // the pause after a retryable failure (RecordRollback): no attempt
		retryIn := time.Duration(*row.retryIn) * time.Microsecond
		return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionHeld, RetryIn: retryIn, Record: row.held(req, retryIn)}}, nil
	}
	if err := m.checkAhead(ctx, pos, row.next); err != nil {
		return store.TxResult{}, err
	}
	return store.TxResult{ClaimResult: store.ClaimResult{Decision: store.DecisionReplay, Record: row.record(req, pos)}, Contended: row.contended}, nil
}

// checkAhead compares the partition's watermark with its high-water mark,
// once per partition and process, the first time a duplicate comes: a
// watermark above it means the partition's offsets started again, and
// every message would be acked as a duplicate. The check is left undone
// while it fails, so that it fails again.
func (m *Mode) checkAhead(ctx context.Context, pos store.KafkaPosition, watermark int64) error {
	part := wmPart(pos)
	if _, ok := m.checked.Load(part); ok {
		return nil
	}
	hwm, err := m.cfg.HighWaterMark(ctx, pos.Topic, pos.Partition)
	if err != nil {
		return fmt.Errorf("oncemill: postgres: watermark claim: reading the high-water mark of %s partition %d: %w", pos.Topic, pos.Partition, err)
	}
	if watermark > hwm {
		g := m.cfg.Group
		return fmt.Errorf("oncemill: postgres: watermark claim: group %q topic %q partition %d: watermark %d, high-water mark %d: %w; "+
			"the topic was probably recreated, and every message would be acked unrun as a duplicate, so none is decided. "+
			"Check, then move the watermark to where processing must start: oncemill watermark move --group %s --topic %s --partition %d --offset 0 --force",
			g, pos.Topic, pos.Partition, watermark, hwm, store.ErrWatermarkAhead, g, pos.Topic, pos.Partition)
	}
	m.checked.Store(part, struct{}{})
	return nil
}

// RecordRollback implements store.Transactional: a cached failure moves the
// watermark past the offset and becomes the row's last outcome; a
// retryable one records the offset's attempt count, one less when
// out.Uncounted gives the attempt back, and, in the same statement, the
// pause before its next attempt (out.RetryAfter, from now() of the
// database) as the row's retry_at. Until then a pessimistic claim of that
// offset answers Held with the time left, and is no attempt (wmHeld); its
// partition's later offsets wait behind it anyway. The fast path never
// meets the pause of its own failures: a failure forgets the partition
// (fast.go).
func (m *Mode) RecordRollback(ctx context.Context, lease store.Claim, _ string, out store.Completion) error {
	if out.Status == store.StatusRetryable {
		if err := requests.ValidateRetry(out); err != nil {
			return fmt.Errorf("oncemill: postgres: watermark record rollback: %w", err)
		}
	}
	pos, err := kafkapos.Parse(lease.Key)
	if err != nil {
		return fmt.Errorf("oncemill: postgres: watermark record rollback: %w", err)
	}
	uuid := pgerr.StorableText(lease.MessageUUID, pgerr.MaxMessageUUIDLen)
	ctx, cancel, err := m.cfg.Gate.Enter(ctx, "watermark record rollback", 0)
	if err != nil {
		return err
	}
	defer m.cfg.Gate.Leave(cancel)
	var tag pgconn.CommandTag
	switch out.Status {
	case store.StatusRetryable:
		attempt := lease.Attempt
		if out.Uncounted {
			attempt--
		}
		tag, err = m.cfg.Pool.Exec(ctx, m.cfg.SQL.retryable, m.cfg.Group, pos.Topic, pos.Partition, pos.Offset, attempt,
			retryMicros(out.RetryAfter))
	case store.StatusCachedFailure:
		tag, err = m.cfg.Pool.Exec(ctx, m.cfg.SQL.failed, m.cfg.Group, pos.Topic, pos.Partition, pos.Offset, lease.Attempt, uuid,
			pgerr.StorableText(string(out.ErrorKind), pgerr.MaxErrorKindLen), pgerr.StorableText(out.ErrorMessage, pgerr.MaxErrorMessageLen))
	default:
		return pgerr.Invalid("watermark record rollback", "outcome status must be failed or retryable, not %v", out.Status)
	}
	if err != nil {
		return pgerr.Wrap("watermark record rollback", err)
	}
	if tag.RowsAffected() == 0 {
		return fmt.Errorf("oncemill: postgres: watermark record rollback %s: the watermark moved past the offset: %w", lease.Key, store.ErrLeaseLost)
	}
	return nil
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
	// retryIn is set for a held-back offset: the time left, in
	// microseconds.
	retryIn *int64
}

// scan reads a claim's row (and the lock_timeout put back, dropped).
func (r *wmRow) scan(row pgx.Row) error {
	return row.Scan(&r.duplicate, &r.next, &r.lastOffset, &r.lastStatus, &r.lastResult, &r.errorKind,
		&r.errorMessage, &r.lastUUID, &r.attempts, &r.token, &r.updatedAt, &r.contended, &r.retryIn, nil)
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

// held is a held-back claim's answer: the offset's retryable record, with
// its attempt count and its next-attempt time (by this process's clock,
// from the time left).
func (r *wmRow) held(req store.TxRequest, retryIn time.Duration) *store.Record {
	return &store.Record{Scope: req.Scope, Key: req.Key, Status: store.StatusRetryable, Token: r.token, Attempt: int(r.attempts),
		CreatedAt: r.updatedAt, UpdatedAt: r.updatedAt, ExpiresAt: r.updatedAt.Add(100 * 365 * 24 * time.Hour), RetryAt: time.Now().Add(retryIn)}
}

// retryMicros is sqlWatermarkRetryable's $6: the pause in microseconds,
// rounded up (0: none).
func retryMicros(d time.Duration) int64 {
	return int64((d + time.Microsecond - 1) / time.Microsecond)
}
