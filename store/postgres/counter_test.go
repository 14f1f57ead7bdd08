package postgres_test

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
)

// statementCounter is a pgx tracer that counts what one pool sends: round
// trips (each Exec, Query or Batch; a statement's first describe on a
// connection is not traced) and the transactions they end. A call ends a
// transaction when it succeeds and leaves the connection idle: a COMMIT, or
// a statement or batch run outside a transaction (its own implicit one). A
// ROLLBACK commits nothing. Counting on the pool, not in pg_stat_database,
// leaves out everything else running on the database.
type statementCounter struct {
	commits, roundTrips atomic.Int64
}

// statementCounts is a snapshot of a statementCounter, or a difference of two.
type statementCounts struct {
	commits, roundTrips float64
}

func (c *statementCounter) load() statementCounts {
	return statementCounts{commits: float64(c.commits.Load()), roundTrips: float64(c.roundTrips.Load())}
}

func (a statementCounts) minus(b statementCounts) statementCounts {
	return statementCounts{commits: a.commits - b.commits, roundTrips: a.roundTrips - b.roundTrips}
}

type rollbackKey struct{}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.roundTrips.Add(1)
	if strings.EqualFold(strings.TrimSpace(data.SQL), "rollback") {
		return context.WithValue(ctx, rollbackKey{}, true)
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if data.Err == nil && ctx.Value(rollbackKey{}) == nil && conn.PgConn().TxStatus() == 'I' {
		c.commits.Add(1)
	}
}

func (c *statementCounter) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.roundTrips.Add(1)
	return ctx
}

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

// TraceBatchEnd counts a batch that left the connection idle: its statements
// ran in one implicit transaction (a pipeline with one Sync) or ended in a
// COMMIT.
func (c *statementCounter) TraceBatchEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	if data.Err == nil && conn.PgConn().TxStatus() == 'I' {
		c.commits.Add(1)
	}
}
