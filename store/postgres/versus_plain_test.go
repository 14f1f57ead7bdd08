package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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
// the handler inserts one business row through its transaction. Three
// variants take turns in rounds of the same number of messages, the order
// rotating each round so that none always runs first, each on a pool of its
// own warmed to the handler count, starting from a freshly migrated, empty
// records table and an empty inbox table, for versusRounds rounds: every
// variant's tables end with the same number of rows (100k). It reports, per
// handler count:
//
//   - ratio: oncemill msgs/s over plain msgs/s, over the whole run;
//   - ratio-first-q, ratio-last-q: the same over the first and the last
//     quarter of the rounds (the second must not fall below the first: no
//     plan or table-growth trap);
//   - commits/msg: the transactions oncemill's pool ended (a COMMIT, or a
//     statement outside a transaction), per oncemill message, counted on
//     that pool's connections by a pgx tracer: nothing else running on the
//     database counts;
//   - round-trips/msg: the calls oncemill's pool made to PostgreSQL (each
//     Exec, Query or Batch), per message;
//   - msgs/s of each variant;
//   - inbox-ratio: the hand-written inbox table a blog post teaches (BEGIN
//     sent with INSERT .. ON CONFLICT DO NOTHING into a table shaped like
//     the records table, the business row, COMMIT), over plain: what this
//     design costs when written by hand, on the same machine in the same run.
//
// The plain variant's own count must come to one commit per message, or the
// benchmark fails: a check of the counter.
//
// Run it once (about 6 minutes):
//
//	go test -run='^$' -bench=TransactionalVersusPlain -benchtime=1x -timeout=30m ./store/postgres
//
// With -short (scripts/test) it runs versusRoundsShort rounds of
// versusRoundShort messages: a check that it runs, not a figure.
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
	versusRounds      = 40    // rounds of every variant: 100k rows in each table
	versusRound       = 2_500 // messages per variant and round
	versusRoundsShort = 4
	versusRoundShort  = 200
)

// versusVariant is one way of handling a message, with the pool it runs on
// and the tracer counting that pool's statements.
type versusVariant struct {
	name   string
	handle func(context.Context, string) error
	pool   *pgxpool.Pool
	count  *statementCounter
	times  []time.Duration
	counts []statementCounts
	// cpu is what the variant's rounds spent (BenchmarkPartitionedVersusInbox).
	cpu hostCPU
}

func versusPlain(b *testing.B, handlers int) {
	ctx := b.Context()
	rounds, perRound := versusRounds, versusRound
	if testing.Short() {
		rounds, perRound = versusRoundsShort, versusRoundShort
	}
	tracedPool := func() (*pgxpool.Pool, *statementCounter) {
		c := &statementCounter{}
		return testenv.Pool(b, func(cfg *pgxpool.Config) {
			cfg.MaxConns = int32(handlers)
			cfg.ConnConfig.Tracer = c
		}), c
	}
	pool, poolCount := tracedPool()
	plainPool, plainCount := tracedPool()
	inboxPool, inboxCount := tracedPool()
	schema := testenv.Schema(b, pool)
	st := newStore(b, pool, postgres.Options{Schema: schema})
	plainTable := pgx.Identifier{schema, "plain_ledger"}.Sanitize()
	onceTable := pgx.Identifier{schema, "oncemill_ledger"}.Sanitize()
	inboxTable := pgx.Identifier{schema, "inbox"}.Sanitize()
	inboxLedger := pgx.Identifier{schema, "inbox_ledger"}.Sanitize()
	for _, q := range []string{
		"CREATE TABLE " + plainTable + " (key text PRIMARY KEY, amount int NOT NULL)",
		"CREATE TABLE " + onceTable + " (key text PRIMARY KEY, amount int NOT NULL)",
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
		br := inboxPool.SendBatch(ctx, batch)
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

	variants := []*versusVariant{
		{name: "plain", handle: plain, pool: plainPool, count: plainCount},
		{name: "oncemill", handle: oncemill, pool: pool, count: poolCount},
		{name: "inbox", handle: inbox, pool: inboxPool, count: inboxCount},
	}
	for _, v := range variants {
		warm(b, v.pool, handlers)
	}
	for round := range rounds {
		for j := range variants {
			v := variants[(round+j)%len(variants)] // a different variant leads each round
			before := v.count.load()
			v.times = append(v.times, versusRoundRun(b, handlers, perRound, v.handle))
			v.counts = append(v.counts, v.count.load().minus(before))
		}
	}
	plainV, onceV, inboxV := variants[0], variants[1], variants[2]
	var rows int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table(schema, "")).Scan(&rows); err != nil {
		b.Fatal(err)
	}
	if want := rounds * perRound; rows != want {
		b.Fatalf("the records table holds %d rows after %d messages", rows, want)
	}
	rate := func(ds []time.Duration) float64 {
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		return float64(len(ds)*perRound) / sum.Seconds()
	}
	perMsg := func(v *versusVariant) statementCounts {
		var sum statementCounts
		for _, c := range v.counts {
			sum.commits += c.commits
			sum.roundTrips += c.roundTrips
		}
		n := float64(len(v.counts) * perRound)
		return statementCounts{commits: sum.commits / n, roundTrips: sum.roundTrips / n}
	}
	if c := perMsg(plainV); c.commits != 1 {
		b.Fatalf("the plain transaction counted %.3f commits per message, want 1: the counter is wrong", c.commits)
	}
	q := max(rounds/4, 1)
	ratio := rate(onceV.times) / rate(plainV.times)
	first := rate(onceV.times[:q]) / rate(plainV.times[:q])
	last := rate(onceV.times[rounds-q:]) / rate(plainV.times[rounds-q:])
	inboxRatio := rate(inboxV.times) / rate(plainV.times)
	oc := perMsg(onceV)
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(first, "ratio-first-q")
	b.ReportMetric(last, "ratio-last-q")
	b.ReportMetric(oc.commits, "commits/msg")
	b.ReportMetric(oc.roundTrips, "round-trips/msg")
	b.ReportMetric(rate(plainV.times), "plain-msgs/s")
	b.ReportMetric(rate(onceV.times), "oncemill-msgs/s")
	b.ReportMetric(rate(inboxV.times), "inbox-msgs/s")
	b.ReportMetric(inboxRatio, "inbox-ratio")
	b.Logf("handlers=%d: %d rounds of %d messages per variant; plain %.0f msgs/s, oncemill %.0f msgs/s, ratio %.3f (first quarter %.3f, last %.3f), %.3f commits and %.3f round trips per message, %d records; hand-written inbox %.0f msgs/s, %.3f of plain (%.3f commits, %.3f round trips per message)",
		handlers, rounds, perRound, rate(plainV.times), rate(onceV.times), ratio, first, last, oc.commits, oc.roundTrips, rows,
		rate(inboxV.times), inboxRatio, perMsg(inboxV).commits, perMsg(inboxV).roundTrips)
}

// warm opens one connection per handler.
func warm(tb testing.TB, pool *pgxpool.Pool, handlers int) {
	conns := make([]*pgxpool.Conn, handlers)
	for i := range conns {
		c, err := pool.Acquire(tb.Context())
		if err != nil {
			tb.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		c.Release()
	}
}

// versusRoundRun runs one round of n messages of a variant over handlers
// goroutines, each message with a fresh random key (hexKey), and returns how
// long the messages took.
func versusRoundRun(b *testing.B, handlers, n int, handle func(context.Context, string) error) time.Duration {
	ctx := b.Context()
	keys := make([]string, n)
	for i := range keys {
		keys[i] = hexKey()
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range handlers {
		wg.Go(func() {
			for {
				i := next.Add(1) - 1
				if i >= int64(n) {
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

// hexKey returns a random key of 32 hex digits: spread over the key space as
// message UUIDs are, and as the md5 keys of a prefilled table
// (fillRetentionWindow) are. In byte order a key of rand.Text()'s alphabet
// (A–Z, 2–7) that starts with a capital sorts after every hex key that
// starts with a digit and before every one that starts with a letter, so
// on a prefilled table a run's claims would go to a few spots of its unique
// index, pages that stay in the buffer cache, where real keys land on any
// page of it.
func hexKey() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}
