package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// BenchmarkClaimStatements measures what the one-transaction claim of a new
// key costs on the server, statement for statement, against the insert of a
// hand-written inbox: each variant's batch, sent with BEGIN in one round
// trip and rolled back, on one connection, small tables, rounds in rotated
// order:
//
//   - begin: BEGIN and SELECT 1, the floor;
//   - inbox: BEGIN and INSERT .. ON CONFLICT DO NOTHING into (key PRIMARY
//     KEY, created_at) with an index on created_at;
//   - delete, partitioned: the batch each layout's store sends for a new
//     key (captured from a real ClaimInTx by a tracer on its pool, then
//     sent again with a fresh key each time);
//   - delete-deferred, partitioned-deferred: the same with the claim
//     deferred, captured with the handler's first statement, SELECT 1,
//     which the floor sends too.
//
// It reports each variant's µs per batch and rollback, and each claim's µs
// above the floor (…-extra-µs). BenchmarkPartitionedVersusInbox runs the
// same claims with the handler's insert and the commit; this one says where
// their difference comes from.
//
//	go test -run='^$' -bench=ClaimStatements -benchtime=1x ./store/postgres
func BenchmarkClaimStatements(b *testing.B) {
	for range b.N {
		claimStatements(b)
	}
}

// batchCapture records the statements of the last batch its pool sent.
type batchCapture struct{ queries []capturedQuery }

type capturedQuery struct {
	sql  string
	args []any
}

func (c *batchCapture) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	c.queries = nil
	return ctx
}

func (c *batchCapture) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	c.queries = append(c.queries, capturedQuery{d.SQL, d.Args})
}

func (*batchCapture) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}

func (*batchCapture) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (*batchCapture) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// withKey returns the batch with every argument equal to old replaced by key.
func withKey(batch []capturedQuery, old, key string) *pgx.Batch {
	b := &pgx.Batch{}
	for _, q := range batch {
		args := append([]any(nil), q.args...)
		for i, a := range args {
			if a == old {
				args[i] = key
			}
		}
		b.Queue(q.sql, args...)
	}
	return b
}

func claimStatements(b *testing.B) {
	ctx := b.Context()
	admin := testenv.Pool(b)
	schema := testenv.Schema(b, admin)
	ident := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }

	// The batch each layout sends for a new key, up front (BEGIN and the
	// claim) and deferred (BEGIN, the claim and the handler's first
	// statement, here SELECT 1).
	const capturedKey = "captured-key"
	claims := map[string][]capturedQuery{}
	for name, layout := range map[string]postgres.Layout{"delete": postgres.LayoutDelete, "partitioned": postgres.LayoutPartitioned} {
		capture := &batchCapture{}
		pool := testenv.Pool(b, func(c *pgxpool.Config) { c.MaxConns = 1; c.ConnConfig.Tracer = capture })
		opts := postgres.Options{Schema: schema, Table: "records_" + name, Layout: layout, Retention: time.Hour}
		if layout == postgres.LayoutPartitioned {
			opts = postgres.WithPartitionWidth(opts, widthOutlasting(time.Hour))
		}
		st := newStore(b, pool, opts)
		if layout == postgres.LayoutPartitioned {
			// As a worker's cleaner does after its first pass: the claim of
			// a new key is then one statement in the partition of now.
			if err := st.RefreshKeyFilters(ctx); err != nil {
				b.Fatal(err)
			}
		}
		for _, deferred := range []bool{false, true} {
			res, err := st.ClaimInTx(ctx, store.TxRequest{Scope: "bench", Key: capturedKey, SuccessTTL: time.Hour, Wait: 5 * time.Second, MessageUUID: capturedKey, Deferrable: deferred})
			if err != nil {
				b.Fatal(err)
			}
			if res.Decision != store.DecisionExecute {
				b.Fatalf("%s: the claim of a new key decided %v", name, res.Decision)
			}
			variant := name
			if deferred {
				variant += "-deferred"
				tx, _ := postgres.TxFromContext(res.Tx.Context(ctx))
				if _, err := tx.Exec(ctx, "SELECT 1"); err != nil {
					b.Fatal(err)
				}
			}
			claims[variant] = capture.queries
			if err := res.Tx.Rollback(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	for _, q := range []string{
		"CREATE TABLE " + ident("inbox") + " (key text PRIMARY KEY, created_at timestamptz NOT NULL)",
		"CREATE INDEX ON " + ident("inbox") + " (created_at)",
	} {
		if _, err := admin.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	batches := map[string]func(key string) *pgx.Batch{
		"begin": func(string) *pgx.Batch {
			bt := &pgx.Batch{}
			bt.Queue("begin")
			bt.Queue("SELECT 1")
			return bt
		},
		"inbox": func(key string) *pgx.Batch {
			bt := &pgx.Batch{}
			bt.Queue("begin")
			bt.Queue("INSERT INTO "+ident("inbox")+" (key, created_at) VALUES ($1, now()) ON CONFLICT DO NOTHING", key)
			return bt
		},
	}
	names := []string{"begin", "inbox", "delete", "partitioned", "delete-deferred", "partitioned-deferred"}
	for _, name := range names[2:] {
		batches[name] = func(key string) *pgx.Batch { return withKey(claims[name], capturedKey, key) }
	}

	conn, err := admin.Acquire(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Release()
	rounds, perRound := 20, 500
	if testing.Short() {
		rounds, perRound = 2, 20
	}
	spent := map[string]time.Duration{}
	n := 0
	for round := range rounds {
		for j := range names {
			name := names[(round+j)%len(names)]
			start := time.Now()
			for range perRound {
				n++
				if err := conn.SendBatch(ctx, batches[name](fmt.Sprintf("k-%d", n))).Close(); err != nil {
					b.Fatalf("%s: %v", name, err)
				}
				if _, err := conn.Exec(ctx, "rollback"); err != nil {
					b.Fatal(err)
				}
			}
			spent[name] += time.Since(start)
		}
	}
	per := func(name string) float64 {
		return float64(spent[name].Microseconds()) / float64(rounds*perRound)
	}
	for _, name := range names {
		b.ReportMetric(per(name), name+"-µs")
		if name != "begin" {
			b.ReportMetric(per(name)-per("begin"), name+"-extra-µs")
		}
	}
	line := fmt.Sprintf("µs per batch and rollback, and above begin (%d rounds of %d):", rounds, perRound)
	for _, name := range names {
		line += fmt.Sprintf(" %s %.1f (%.1f)", name, per(name), per(name)-per("begin"))
	}
	b.Log(line)
}

// widthOutlasting is a partition width, of a day or a few hours more,
// whose partition of now lasts at least d longer: the captured claims of
// the partitioned layout name the partition of now, and once its range has
// ended the server refuses them (the deferred form) or they take nothing
// (the one up front). Partitions start at multiples of their width (as
// time.Truncate rounds), so widths an hour apart end at different times.
func widthOutlasting(d time.Duration) time.Duration {
	now := time.Now()
	w := 24 * time.Hour
	for now.Truncate(w).Add(w).Sub(now) < d {
		w += time.Hour
	}
	return w
}
