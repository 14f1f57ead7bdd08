package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncemill/oncemill/store"
)

// The watermark mode's fast path (docs/kafka.md, "Watermark mode"). A
// partition's messages come one at a time, so the process that committed
// offset N usually sees N+1 next, and the row holds what that commit left:
// the claim would only read back what the process already knows. After a
// clean commit the process keeps the partition's watermark (wmCache); the
// next claim at or above it sends nothing: the handler's transaction
// begins with its first statement, BEGIN and statement in one round trip
// (lazyTx), and the commit does the claim's work, in COMMIT's round trip,
// with sqlWatermarkCommitFast: the function of migration 5 advances the
// watermark if it is still at or below the offset, and otherwise raises
// wmMovedCode, which aborts the transaction, so the COMMIT pipelined after
// it commits nothing. Two owners of a partition are then ordered at the
// commit, by the row's lock, rather than at the claim: the second finds the
// watermark moved, rolls back, and its delivery is answered from the row
// (errWatermarkMoved: the stage claims again, the pessimistic way, and
// replays).
//
// Everything but a clean commit forgets the partition (a claim takes the
// entry out): a failure, a rollback, a duplicate, an offset below the
// entry, a process's first message of the partition. The next claim then
// takes the pessimistic path (watermark.go), which reads the row under its
// lock; so attempts past the first, cached failures and replays go the way
// they went before. The cache never decides anything by itself: the commit
// checks the row.

// wmMovedCode is the SQLSTATE the commit function raises when the watermark
// moved past the offset.
const wmMovedCode = "OM001"

// Other commit failures that say another transaction got in the way: under
// REPEATABLE READ or SERIALIZABLE, the row updated by another owner since the
// snapshot (or another serialization conflict), and a deadlock with another
// owner's claim. The stage claims again the pessimistic way, which decides
// from the row.
const (
	serializationFailure = "40001"
	deadlockDetected     = "40P01"
)

// errWatermarkMoved: the fast path's commit found the watermark past its
// offset, or conflicted with another transaction; nothing was committed.
// It wraps store.ErrLeaseLost: the offset is, or may be, another owner's.
var errWatermarkMoved = fmt.Errorf("the partition's watermark moved past the offset, or another owner's transaction conflicted, before the commit: nothing was committed: %w", store.ErrLeaseLost)

// sqlWatermarkCommitFast calls the commit function: $1 group, $2 topic, $3
// partition, $4 offset, $5 message UUID, $6 produced messages.
const sqlWatermarkCommitFast = `SELECT {{WM_COMMIT}}($1::text, $2::text, $3::int4, $4::int8, $5::text, $6::bytea)`

// wmKnown is what a process knows of a partition after its own commit.
type wmKnown struct {
	next  int64 // the watermark: the next offset
	token int64
}

// wmCache holds, per partition ("topic/partition"), the watermark this
// process committed last.
type wmCache struct {
	mu sync.Mutex
	m  map[string]wmKnown
}

func wmPart(pos store.KafkaPosition) string {
	return pos.Topic + "/" + strconv.Itoa(int(pos.Partition))
}

// take removes the partition's entry and returns it if offset is at or
// above its watermark. Taking it out means every outcome but a clean commit
// (which puts one back) leaves the partition to the pessimistic path.
func (c *wmCache) take(part string, offset int64) (wmKnown, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.m[part]
	delete(c.m, part)
	return k, ok && offset >= k.next
}

func (c *wmCache) put(part string, k wmKnown) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[string]wmKnown{}
	}
	c.m[part] = k
}

// commitFast ends a fast-path transaction: the commit function, then
// COMMIT, in one round trip; the commit function alone, in a transaction of
// its own, when the handler sent no statement.
func (t *claimTx) commitFast(ctx context.Context, result []byte) error {
	lz, wm := t.lazy, t.wm
	settled := lz.settle()
	args := []any{wm.group, wm.pos.Topic, wm.pos.Partition, wm.pos.Offset, wm.uuid, result}
	var token int64
	var err error
	switch {
	case settled != nil || lz.broken != nil || lz.tx != nil && t.conn.Conn().PgConn().TxStatus() != 'T':
		rollback(ctx, t.conn)
		return wrap("commit", errAborted)
	case lz.tx == nil:
		err = t.conn.QueryRow(ctx, t.s.wm.commitFast, args...).Scan(&token)
	default:
		b := &pgx.Batch{}
		b.Queue(t.s.wm.commitFast, args...)
		b.Queue("commit")
		br := t.conn.SendBatch(ctx, b)
		var tag pgconn.CommandTag
		if err = br.QueryRow().Scan(&token); err == nil {
			tag, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil && tag.String() != "COMMIT" {
			err = errAborted
		}
	}
	rollback(ctx, t.conn) // a no-op after a commit; releases the connection
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (pgErr.Code == wmMovedCode || pgErr.Code == serializationFailure || pgErr.Code == deadlockDetected):
		return fmt.Errorf("oncemill: postgres: commit %s: %w (%w)", t.key, errWatermarkMoved, err)
	case err != nil:
		return wrap("commit", err)
	}
	wm.cache.put(wmPart(wm.pos), wmKnown{next: wm.pos.Offset + 1, token: token})
	return nil
}

// lazyTx is the fast path's pgx.Tx: BEGIN goes out with the handler's
// first statement, in one batch (pgx.Batch.BeginTx), rather than in a
// round trip of its own. What cannot share a batch (CopyFrom, Prepare, a
// savepoint, LargeObjects, Conn, a statement with a query mode option or
// several statements in one string) sends BEGIN alone first. Until the
// first statement, tx is nil.
type lazyTx struct {
	conn interface {
		SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
		BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
		Conn() *pgx.Conn
	}
	opts pgx.TxOptions
	// beginCtx bounds a BEGIN sent where no context is given (Conn,
	// LargeObjects).
	beginCtx func() (context.Context, context.CancelFunc)
	tx       pgx.Tx
	// pending is the batch the first statement went out in while its rows
	// are still being read (Query, QueryRow): it is closed when they are,
	// or before the next statement.
	pending pgx.BatchResults
	// broken is set when BEGIN failed where the error could not be
	// returned: the transaction must not commit.
	broken error
}

var _ pgx.Tx = (*lazyTx)(nil)

// settle closes the pending batch, if any.
func (t *lazyTx) settle() error {
	if t.pending == nil {
		return nil
	}
	br := t.pending
	t.pending = nil
	return br.Close()
}

// begin sends BEGIN alone, unless the transaction has begun.
func (t *lazyTx) begin(ctx context.Context) error {
	if err := t.settle(); err != nil {
		return err
	}
	if t.tx != nil {
		return nil
	}
	tx, err := t.conn.BeginTx(ctx, t.opts)
	if err != nil {
		return err
	}
	t.tx = tx
	return nil
}

// started returns the begun transaction, after closing a pending batch, or
// nil when the next statement can carry BEGIN.
func (t *lazyTx) started() (pgx.Tx, error) {
	if err := t.settle(); err != nil {
		return nil, err
	}
	return t.tx, nil
}

// batchable: a statement that can go out in a batch with BEGIN. pgx sends
// Exec without arguments with the simple protocol, which allows several
// statements in one string; a batch does not, so such a string (any ';')
// begins alone. A query mode or result format option is not a batch's
// either.
func batchable(sql string, args []any, exec bool) bool {
	if exec && len(args) == 0 && strings.Contains(sql, ";") {
		return false
	}
	if len(args) > 0 {
		switch args[0].(type) {
		case pgx.QueryExecMode, pgx.QueryResultFormats, pgx.QueryResultFormatsByOID:
			return false
		}
	}
	return true
}

// send sends BEGIN and the batch's statements, and reads BEGIN's result.
func (t *lazyTx) send(ctx context.Context, b *pgx.Batch) (pgx.BatchResults, error) {
	br := t.conn.SendBatch(ctx, b)
	t.tx = br.Tx()
	if _, err := br.Exec(); err != nil {
		br.Close()
		t.tx = nil // nothing began: the next statement tries again
		return nil, err
	}
	return br, nil
}

func (t *lazyTx) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tx, err := t.started()
	switch {
	case err != nil:
		return pgconn.CommandTag{}, err
	case tx == nil && !batchable(sql, args, true):
		if err := t.begin(ctx); err != nil {
			return pgconn.CommandTag{}, err
		}
		tx = t.tx
	}
	if tx != nil {
		return tx.Exec(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.BeginTx(t.opts)
	b.Queue(sql, args...)
	br, err := t.send(ctx, b)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	tag, err := br.Exec()
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	return tag, err
}

func (t *lazyTx) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	tx, err := t.started()
	switch {
	case err != nil:
		return errRow{err}
	case tx == nil && !batchable(sql, args, false):
		if err := t.begin(ctx); err != nil {
			return errRow{err}
		}
		tx = t.tx
	}
	if tx != nil {
		return tx.QueryRow(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.BeginTx(t.opts)
	b.Queue(sql, args...)
	br, err := t.send(ctx, b)
	if err != nil {
		return errRow{err}
	}
	t.pending = br
	return lazyRow{t: t, row: br.QueryRow()}
}

// lazyRow closes the first statement's batch once scanned.
type lazyRow struct {
	t   *lazyTx
	row pgx.Row
}

func (r lazyRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	if cerr := r.t.settle(); err == nil {
		err = cerr
	}
	return err
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func (t *lazyTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	tx, err := t.started()
	switch {
	case err != nil:
		return nil, err
	case tx == nil && !batchable(sql, args, false):
		if err := t.begin(ctx); err != nil {
			return nil, err
		}
		tx = t.tx
	}
	if tx != nil {
		return tx.Query(ctx, sql, args...)
	}
	b := &pgx.Batch{}
	b.BeginTx(t.opts)
	b.Queue(sql, args...)
	br, err := t.send(ctx, b)
	if err != nil {
		return nil, err
	}
	t.pending = br
	rows, err := br.Query()
	if err != nil {
		if cerr := t.settle(); cerr != nil && rows == nil {
			return nil, cerr
		}
		return rows, err
	}
	return &lazyRows{Rows: rows, t: t}, nil
}

// lazyRows closes the first statement's batch when the rows are closed,
// or read to the end (pgx closes them then).
type lazyRows struct {
	pgx.Rows
	t   *lazyTx
	err error
}

func (r *lazyRows) Next() bool {
	if r.Rows.Next() {
		return true
	}
	r.Close()
	return false
}

func (r *lazyRows) Close() {
	r.Rows.Close()
	if err := r.t.settle(); err != nil && r.err == nil {
		r.err = err
	}
}

func (r *lazyRows) Err() error {
	if err := r.Rows.Err(); err != nil {
		return err
	}
	return r.err
}

func (t *lazyTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	tx, err := t.started()
	switch {
	case err != nil:
		return pgx.FailedBatchResults(b, err)
	case tx == nil && b.Len() == 0:
		if err := t.begin(ctx); err != nil {
			return pgx.FailedBatchResults(b, err)
		}
		tx = t.tx
	}
	if tx != nil {
		return tx.SendBatch(ctx, b)
	}
	// The handler's queued queries, callbacks included, after BEGIN.
	nb := &pgx.Batch{}
	nb.BeginTx(t.opts)
	nb.QueuedQueries = append(nb.QueuedQueries, b.QueuedQueries...)
	br, err := t.send(ctx, nb)
	if err != nil {
		return pgx.FailedBatchResults(b, err)
	}
	t.pending = br
	return lazyBatch{BatchResults: br, t: t}
}

// lazyBatch is the handler's batch, sent after BEGIN in the same batch:
// its Close closes both.
type lazyBatch struct {
	pgx.BatchResults
	t *lazyTx
}

func (b lazyBatch) Close() error {
	if b.t.pending != b.BatchResults {
		return b.BatchResults.Close() // closed already: its first error again
	}
	return b.t.settle()
}

// Tx is nil: the handler's batch began no transaction of its own.
func (b lazyBatch) Tx() pgx.Tx { return nil }

func (t *lazyTx) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Begin(ctx)
}

func (t *lazyTx) CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, src pgx.CopyFromSource) (int64, error) {
	if err := t.begin(ctx); err != nil {
		return 0, err
	}
	return t.tx.CopyFrom(ctx, table, columns, src)
}

func (t *lazyTx) Prepare(ctx context.Context, name, sql string) (*pgconn.StatementDescription, error) {
	if err := t.begin(ctx); err != nil {
		return nil, err
	}
	return t.tx.Prepare(ctx, name, sql)
}

// beginNow begins where no context is given and no error can be returned.
// A failure closes the connection, so that nothing the handler sends on it
// runs outside the transaction, leaves a closed pgx.Tx (its statements
// fail with pgx.ErrTxClosed), and makes the commit refuse.
func (t *lazyTx) beginNow() {
	ctx, cancel := t.beginCtx()
	defer cancel()
	if err := t.begin(ctx); err != nil {
		t.broken = err
		_ = t.conn.Conn().Close(ctx)
		b := &pgx.Batch{}
		b.BeginTx(t.opts)
		t.tx = pgx.FailedBatchResults(b, err).Tx()
	}
}

func (t *lazyTx) LargeObjects() pgx.LargeObjects {
	t.beginNow()
	return t.tx.LargeObjects()
}

// Conn is the connection, in the begun transaction: statements sent on it
// directly are the transaction's.
func (t *lazyTx) Conn() *pgx.Conn {
	t.beginNow()
	return t.conn.Conn()
}

// Commit and Rollback serve no caller: the handler's top level refuses
// them (handlerTx), and its savepoints are pgx's.
func (t *lazyTx) Commit(ctx context.Context) error {
	if err := t.begin(ctx); err != nil {
		return err
	}
	return t.tx.Commit(ctx)
}

func (t *lazyTx) Rollback(ctx context.Context) error {
	if err := t.settle(); err != nil || t.tx == nil {
		return err
	}
	return t.tx.Rollback(ctx)
}
