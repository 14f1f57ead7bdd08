package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
)

// BenchmarkTransactionalVersusPlain compares the one-transaction mode with
// the plain pgx transaction a hand-written consumer would use, in one run:
// the handler inserts one business row through its transaction. The two
// variants take turns in rounds, each on a pool of its own warmed to the
// handler count, starting from a freshly migrated, empty records table,
// until the records table holds at least 100k rows. It reports, per handler
// count:
//
//   - ratio: oncemill msgs/s over plain msgs/s, over the whole run;
//   - ratio-first-q, ratio-last-q: the same over the first and the last
//     quarter of the rounds (the second must not fall below the first: no
//     plan or table-growth trap);
//   - commits/msg: pg_stat_database.xact_commit per oncemill message over
//     one more round after the timed ones, on fresh connections read once
//     they have closed (a backend reports its counts when it exits);
//   - msgs/s of each variant;
//   - inbox-ratio: the hand-written inbox table a blog post teaches (BEGIN
//     sent with INSERT .. ON CONFLICT DO NOTHING into a table shaped like
//     the records table, the business row, COMMIT), over plain, run every
//     fourth round: what this design costs when written by hand, on the
//     same machine in the same run.
//
// Run it once (about 3 minutes):
//
//	go test -run='^$' -bench=TransactionalVersusPlain -benchtime=1x -timeout=20m ./store/postgres
func BenchmarkTransactionalVersusPlain(b *testing.B) {
	for _, handlers := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("handlers=%d", handlers), func(b *testing.B) {
			for range b.N {
				versusPlain(b, handlers)
			}
		})
	}
}

const (
	versusRows  = 100_000 // the records table's size at the end of a run
	versusRound = 2_500   // messages per variant and round
)

func versusPlain(b *testing.B, handlers int) {
	ctx := b.Context()
	pool := testenv.Pool(b, func(c *pgxpool.Config) { c.MaxConns = int32(handlers) })
	plainPool := testenv.Pool(b, func(c *pgxpool.Config) { c.MaxConns = int32(handlers) })
	stats := testenv.Pool(b, func(c *pgxpool.Config) { c.MaxConns = 1 })
	schema := testenv.Schema(b, pool)
	st := newStore(b, pool, postgres.Options{Schema: schema})
	plainTable := pgx.Identifier{schema, "plain_ledger"}.Sanitize()
	onceTable := pgx.Identifier{schema, "oncemill_ledger"}.Sanitize()
	for _, t := range []string{plainTable, onceTable} {
		if _, err := pool.Exec(ctx, "CREATE TABLE "+t+" (key text PRIMARY KEY, amount int NOT NULL)"); err != nil {
			b.Fatal(err)
		}
	}
	inboxTable := pgx.Identifier{schema, "inbox"}.Sanitize()
	inboxLedger := pgx.Identifier{schema, "inbox_ledger"}.Sanitize()
	for _, q := range []string{
		"CREATE TABLE " + inboxTable + " (LIKE " + table(schema, "") + " INCLUDING ALL)",
		"CREATE TABLE " + inboxLedger + " (key text PRIMARY KEY, amount int NOT NULL)",
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	inboxClaim := "INSERT INTO " + inboxTable + ` (scope, key, fingerprint, status, token, attempt, created_at, updated_at, expires_at, purge_at)
		VALUES ('bench', $1, '', 2, 1, 1, now(), now(), now() + interval '1 day', now() + interval '1 day') ON CONFLICT DO NOTHING`
	inboxInsert := "INSERT INTO " + inboxLedger + " (key, amount) VALUES ($1, 100)"
	inbox := func(ctx context.Context, key string) error {
		batch := &pgx.Batch{}
		batch.BeginTx(pgx.TxOptions{})
		batch.Queue(inboxClaim, key)
		br := plainPool.SendBatch(ctx, batch)
		_, err := br.Exec()
		var tag pgconn.CommandTag
		if err == nil {
			tag, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		tx := br.Tx()
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return fmt.Errorf("inbox: key %s seen twice", key)
		}
		if _, err := tx.Exec(ctx, inboxInsert, key); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	plainInsert := "INSERT INTO " + plainTable + " (key, amount) VALUES ($1, 100)"
	onceInsert := "INSERT INTO " + onceTable + " (key, amount) VALUES ($1, 100)"

	r, err := receiver.NewTransactional(st).WithScope("bench").Build()
	if err != nil {
		b.Fatal(err)
	}
	once := r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), onceInsert, msg.UUID)
		return nil, err
	})
	plain := func(ctx context.Context, key string) error {
		tx, err := plainPool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
		if _, err := tx.Exec(ctx, plainInsert, key); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
	payload := []byte(`{"amount":100}`)
	oncemill := func(_ context.Context, key string) error {
		_, err := once(message.NewMessage(key, payload))
		return err
	}

	warm(b, pool, handlers)
	warm(b, plainPool, handlers)
	var plainTimes, onceTimes, inboxTimes, inboxPlainTimes []time.Duration
	rows := 0
	for round := 0; rows < versusRows; round++ {
		plainTimes = append(plainTimes, versusRoundRun(b, handlers, plain))
		onceTimes = append(onceTimes, versusRoundRun(b, handlers, oncemill))
		if round%4 == 0 {
			inboxTimes = append(inboxTimes, versusRoundRun(b, handlers, inbox))
			inboxPlainTimes = append(inboxPlainTimes, plainTimes[len(plainTimes)-1])
		}
		if err := stats.QueryRow(ctx, "SELECT count(*) FROM "+table(schema, "")).Scan(&rows); err != nil {
			b.Fatal(err)
		}
	}
	plainPool.Reset()
	before := committed(b, stats, pool)
	warm(b, pool, handlers)
	versusRoundRun(b, handlers, oncemill)
	commits := committed(b, stats, pool) - before
	rate := func(ds []time.Duration) float64 {
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		return float64(len(ds)*versusRound) / sum.Seconds()
	}
	q := max(len(onceTimes)/4, 1)
	ratio := rate(onceTimes) / rate(plainTimes)
	first := rate(onceTimes[:q]) / rate(plainTimes[:q])
	last := rate(onceTimes[len(onceTimes)-q:]) / rate(plainTimes[len(plainTimes)-q:])
	perMsg := float64(commits) / versusRound
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(first, "ratio-first-q")
	b.ReportMetric(last, "ratio-last-q")
	b.ReportMetric(perMsg, "commits/msg")
	b.ReportMetric(rate(plainTimes), "plain-msgs/s")
	b.ReportMetric(rate(onceTimes), "oncemill-msgs/s")
	inboxRatio := rate(inboxTimes) / rate(inboxPlainTimes)
	b.ReportMetric(inboxRatio, "inbox-ratio")
	b.Logf("handlers=%d: %d rounds of %d; plain %.0f msgs/s, oncemill %.0f msgs/s, ratio %.3f (first quarter %.3f, last %.3f), %.3f commits/msg, %d records; hand-written inbox %.0f msgs/s, %.3f of plain",
		handlers, len(onceTimes), versusRound, rate(plainTimes), rate(onceTimes), ratio, first, last, perMsg, rows, rate(inboxTimes), inboxRatio)
}

// warm opens one connection per handler.
func warm(b *testing.B, pool *pgxpool.Pool, handlers int) {
	conns := make([]*pgxpool.Conn, handlers)
	for i := range conns {
		c, err := pool.Acquire(b.Context())
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
}

// versusRoundRun runs one round of a variant over handlers goroutines, each
// message with a fresh random key, and returns how long the messages took.
func versusRoundRun(b *testing.B, handlers int, handle func(context.Context, string) error) time.Duration {
	ctx := b.Context()
	keys := make([]string, versusRound)
	for i := range keys {
		keys[i] = rand.Text()
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range handlers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= versusRound {
					return
				}
				if err := handle(ctx, keys[i]); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	if b.Failed() {
		b.FailNow()
	}
	return took
}

// committed returns the database's xact_commit once every connection of
// pool has closed and so reported its counts.
func committed(b *testing.B, stats, pool *pgxpool.Pool) int64 {
	ctx := b.Context()
	pool.Reset()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var others int
		if err := stats.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()
			AND application_name = ''`).Scan(&others); err != nil {
			b.Fatal(err)
		}
		if others == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	var n int64
	if err := stats.QueryRow(ctx, "SELECT pg_stat_clear_snapshot()::text, xact_commit FROM pg_stat_database WHERE datname = current_database()").Scan(nil, &n); err != nil {
		b.Fatal(err)
	}
	return n
}
