package postgres_test

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
)

// statementCounter is a pgx tracer that counts what one pool sends: round
// trips (each Exec, Query or Batch; a statement's first describe on a
// connection is not traced), statements (each Exec or Query, and each of
// a batch's) and the transactions they end. A call ends a
// transaction when it succeeds and leaves the connection idle: a COMMIT, or
// a statement or batch run outside a transaction (its own implicit one). A
// ROLLBACK commits nothing. Counting on the pool, not in pg_stat_database,
// leaves out everything else running on the database.
type statementCounter struct {
	commits, roundTrips, statements atomic.Int64
}

// statementCounts is a snapshot of a statementCounter, or a difference of two.
type statementCounts struct {
	commits, roundTrips, statements float64
}

func (c *statementCounter) load() statementCounts {
	return statementCounts{commits: float64(c.commits.Load()), roundTrips: float64(c.roundTrips.Load()), statements: float64(c.statements.Load())}
}

func (a statementCounts) minus(b statementCounts) statementCounts {
	return statementCounts{commits: a.commits - b.commits, roundTrips: a.roundTrips - b.roundTrips, statements: a.statements - b.statements}
}

type rollbackKey struct{}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.roundTrips.Add(1)
	c.statements.Add(1)
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

func (c *statementCounter) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {
	c.statements.Add(1)
}

// TraceBatchEnd counts a batch that left the connection idle: its statements
// ran in one implicit transaction (a pipeline with one Sync) or ended in a
// COMMIT.
func (c *statementCounter) TraceBatchEnd(_ context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	if data.Err == nil && conn.PgConn().TxStatus() == 'I' {
		c.commits.Add(1)
	}
}

// TestStatementCounter pins what the benchmarks' commits/msg count
// (poolMeter), on the real server.
func TestStatementCounter(t *testing.T) {
	c := &statementCounter{}
	pool := testenv.Pool(t, func(cfg *pgxpool.Config) { cfg.MaxConns = 1; cfg.ConnConfig.Tracer = c })
	ctx := t.Context()
	step := func(name string, commits, roundTrips, statements float64, run func() error) {
		t.Helper()
		before := c.load()
		if err := run(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := c.load().minus(before); got != (statementCounts{commits: commits, roundTrips: roundTrips, statements: statements}) {
			t.Errorf("%s counted %+v, want %v commits, %v round trips and %v statements", name, got, commits, roundTrips, statements)
		}
	}
	step("a statement outside a transaction", 1, 1, 1, func() error {
		_, err := pool.Exec(ctx, "SELECT 1")
		return err
	})
	step("BEGIN, a statement, COMMIT", 1, 3, 3, func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
	step("BEGIN, a statement, ROLLBACK", 0, 3, 3, func() error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
			return err
		}
		return tx.Rollback(ctx)
	})
	step("a batch of two statements, one implicit transaction", 1, 1, 2, func() error {
		batch := &pgx.Batch{}
		batch.Queue("SELECT 1")
		batch.Queue("SELECT 2")
		return pool.SendBatch(ctx, batch).Close()
	})
	step("a batch that begins, then a statement and COMMIT", 1, 3, 4, func() error {
		batch := &pgx.Batch{}
		batch.BeginTx(pgx.TxOptions{})
		batch.Queue("SELECT 1")
		br := pool.SendBatch(ctx, batch)
		if err := br.Close(); err != nil {
			return err
		}
		tx := br.Tx()
		if _, err := tx.Exec(ctx, "SELECT 2"); err != nil {
			return err
		}
		return tx.Commit(ctx)
	})
}
