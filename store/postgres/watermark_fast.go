package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncemill/oncemill/store"
)

// The watermark mode's fast path (docs/kafka.md, "The watermark mode"). A
// partition's messages come one at a time, so the process that committed
// offset N usually sees N+1 next, and the row holds what that commit left:
// the claim would only read back what the process already knows. After a
// clean commit the process keeps the partition's watermark (wmCache); the
// claim of the next offset sends nothing: the handler's transaction
// begins with its first statement, BEGIN and statement in one round trip
// (lazytx), and the commit does the claim's work, in COMMIT's round trip,
// with sqlWatermarkCommitFast, which advances the watermark if it is still
// at or below the offset, and otherwise fails, which aborts the
// transaction, so the COMMIT pipelined after it commits nothing. Two owners
// of a partition are then ordered at the commit, by the row's lock, rather
// than at the claim: the second finds the watermark moved, rolls back, and
// its delivery is answered from the row (errWatermarkMoved: the stage
// claims again, the pessimistic way, and replays).
//
// Everything but a clean commit forgets the partition (a claim takes the
// entry out): a failure, a rollback, a duplicate, an offset below the
// entry, a process's first message of the partition. The next claim then
// takes the pessimistic path (watermark.go), which reads the row under its
// lock; so attempts past the first, cached failures and replays go the way
// they went before. The cache never decides anything by itself: the commit
// checks the row.

// invalidTextRepresentation is the SQLSTATE of sqlWatermarkCommitFast when
// the watermark moved past the offset: its marker, cast to a number.
const invalidTextRepresentation = "22P02"

// Other commit failures that say another transaction got in the way: under
// REPEATABLE READ or SERIALIZABLE, the row updated by another owner since
// the snapshot (or another serialization conflict), and a deadlock with
// another owner's claim. The stage claims again the pessimistic way, which
// decides from the row.
const (
	serializationFailure = "40001"
	deadlockDetected     = "40P01"
)

// errWatermarkMoved: the fast path's commit found the watermark past its
// offset, or conflicted with another transaction; nothing was committed.
// It wraps store.ErrLeaseLost: the offset is, or may be, another owner's.
var errWatermarkMoved = fmt.Errorf("the partition's watermark moved past the offset, or another owner's transaction conflicted, before the commit: nothing was committed: %w", store.ErrLeaseLost)

// sqlWatermarkCommitFast is the fast path's claim, sent with COMMIT: $1
// group, $2 topic, $3 partition, $4 offset, $5 message UUID, $6 produced
// messages. It moves the watermark past the offset and records it as the
// last one with the claims' SET list (wmSet, as a non-duplicate), if the
// watermark is still at or below the offset, waiting for the row's lock if
// another owner holds it; it returns the row's new token. If the watermark moved
// past the offset, no row is updated and the statement fails casting
// wmMovedMarker to a number (SQLSTATE 22P02, the marker in the message):
// the error aborts the transaction on the server. One plain statement
// rather than a PL/pgSQL function that raises a code of its own: the
// function's call cost 1-4% of the benchmark's throughput
// (docs/benchmarks-history.md).
const sqlWatermarkCommitFast = `
WITH up AS (
	UPDATE {{WATERMARKS}} AS w SET` + wmSet + `
	WHERE w.group_id = $1 AND w.topic = $2 AND w.partition = $3 AND w.next_offset <= $4::int8
	RETURNING w.token
)
SELECT coalesce((SELECT token::text FROM up), '` + wmMovedMarker + `')::int8`

// wmMovedMarker is the text sqlWatermarkCommitFast fails to cast.
const wmMovedMarker = "oncemill: the watermark moved past the offset"

// wmKnown is what a process knows of a partition after its own commit.
type wmKnown struct {
	next  int64 // the watermark: the next offset
	token int64
}

// wmCache holds, per partition, the watermark this process committed last.
type wmCache struct {
	mu sync.Mutex
	m  map[wmPartition]wmKnown
}

// wmPartition names a partition in the process's maps: a comparable
// struct, so that a claim builds no string to look it up.
type wmPartition struct {
	topic     string
	partition int32
}

func wmPart(pos store.KafkaPosition) wmPartition {
	return wmPartition{pos.Topic, pos.Partition}
}

// take removes the partition's entry and returns it if offset is its
// watermark: the offset right after this process's last commit. Only that
// one: an offset further on means the partition's messages did not come
// here in order (a gap of compaction or a transaction marker, or offsets
// another owner handled, then a rebalance brought the partition back), and
// the row, not the cache, knows what it holds. Taking the entry out means
// every outcome but a clean commit (which puts one back) leaves the
// partition to the pessimistic path.
func (c *wmCache) take(part wmPartition, offset int64) (wmKnown, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.m[part]
	delete(c.m, part)
	return k, ok && offset == k.next
}

func (c *wmCache) put(part wmPartition, k wmKnown) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[wmPartition]wmKnown{}
	}
	c.m[part] = k
}

// commitFast ends a fast-path transaction: the commit function, then
// COMMIT, in one round trip; the commit function alone, in a transaction of
// its own, when the handler sent no statement.
func (t *claimTx) commitFast(ctx context.Context, result []byte) error {
	lz, wm := t.lazy, t.wm
	settled := lz.Settle()
	args := []any{wm.group, wm.pos.Topic, wm.pos.Partition, wm.pos.Offset, wm.uuid, result}
	var token int64
	var err error
	switch {
	case settled != nil || lz.Broken() != nil || lz.Begun() && t.conn.Conn().PgConn().TxStatus() != 'T':
		rollback(ctx, t.conn)
		return wrap("commit", errAborted)
	case !lz.Begun():
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
	case errors.As(err, &pgErr) && (pgErr.Code == invalidTextRepresentation && strings.Contains(pgErr.Message, wmMovedMarker) || pgErr.Code == serializationFailure || pgErr.Code == deadlockDetected):
		return fmt.Errorf("oncemill: postgres: commit %s: %w (%w)", t.key, errWatermarkMoved, err)
	case err != nil:
		return wrap("commit", err)
	}
	wm.cache.put(wmPart(wm.pos), wmKnown{next: wm.pos.Offset + 1, token: token})
	return nil
}
