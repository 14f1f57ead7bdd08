package postgres_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store/postgres"
)

// BenchmarkTransactionalVersusPlain compares the one-transaction mode with
// the hand-written code a consumer who accepts the same trade would write,
// in one run: the handler inserts one business row through its
// transaction. Five variants take turns in rounds of the same number of
// messages, the order rotating each round so that none always runs first,
// each on a pool of its own (meteredPool) warmed to the handler count, each
// writing tables of its own that start empty and end with the same number of
// rows (versusRounds × versusRound, and a few warming up):
//
//   - plain: BEGIN, the INSERT, COMMIT (insertIn): no idempotency, the
//     ceiling;
//   - inbox: the hand-written inbox in three round trips (inboxHandler):
//     BEGIN sent with INSERT .. ON CONFLICT DO NOTHING into a table keyed by
//     the message (with the created_at index its cleanup needs), the INSERT,
//     COMMIT;
//   - inbox-2rt: the same in two round trips (inbox2RTHandler): BEGIN, the
//     inbox row and the INSERT in one batch, then COMMIT, or ROLLBACK when
//     the key was there: the trade of the deferred claim, the handler's
//     statement run before the claim is known;
//   - oncemill: receiver.NewTransactional, the claim decided up front (the
//     builder's default);
//   - oncemill-deferred: the same with WithDeferredClaim(true).
//
// It reports, per handler count, throughput ratios as the median over the
// rounds of the ratio of the two variants' rates in that round (a slow
// spell of the machine that falls on a few rounds moves them little):
//
//   - oncemill/inbox: the up-front claim against the three-round-trip inbox;
//   - deferred/inbox-2rt: the deferred claim against the two-round-trip
//     inbox;
//   - inbox/plain and inbox-2rt/inbox: what the hand-written inbox costs,
//     and what its second form saves;
//
// and per variant, over its rounds: <variant>-msgs/s, and per message
// <variant>-client-µs/msg (this process's CPU during the variant's rounds,
// a garbage collection closing each round so that each variant pays for
// its own garbage), <variant>-server-µs/msg (the CPU of the variant's own
// backends, by their pids), <variant>-round-trips/msg and
// <variant>-commits/msg (counted on the variant's own connections; see
// poolMeter). Those costs move far less than throughput on a shared
// machine. The plain variant must come to one commit per message, or the
// benchmark fails: a check of the counter. Every goroutine of a variant's
// rounds carries the pprof label variant=<name>, for a CPU profile's
// -tagfocus.
//
// Run it once (about 3 minutes on a 2-core machine):
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
	versusRounds      = 20    // rounds of every variant: 40k rows in each table
	versusRound       = 2_000 // messages per variant and round
	versusRoundsShort = 3
	versusRoundShort  = 100
)

// versusPlainVariants are BenchmarkTransactionalVersusPlain's variants, in
// the order of the first round; each name is also its tables' prefix.
var versusPlainVariants = []string{"plain", "inbox", "inbox-2rt", "oncemill", "oncemill-deferred"}

// versusVariant is one way of handling a message, with the pool it runs on,
// that pool's meter, and what its rounds took and spent.
type versusVariant struct {
	name   string
	handle func(context.Context, string) error
	pool   *pgxpool.Pool
	meter  *poolMeter
	times  []time.Duration
	spent  meterSpent
}

func versusPlain(b *testing.B, handlers int) {
	ctx := b.Context()
	rounds, perRound := versusRounds, versusRound
	if testing.Short() {
		rounds, perRound = versusRoundsShort, versusRoundShort
	}
	admin := testenv.Pool(b)
	schema := testenv.Schema(b, admin)
	ident := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	variants := make([]*versusVariant, len(versusPlainVariants))
	byName := map[string]*versusVariant{}
	for i, name := range versusPlainVariants {
		pool, meter := meteredPool(b, handlers)
		variants[i] = &versusVariant{name: name, pool: pool, meter: meter}
		byName[name] = variants[i]
	}
	// Each oncemill variant has a records table of its own.
	onceStore := newStore(b, byName["oncemill"].pool, postgres.Options{Schema: schema, Table: "records_oncemill"})
	deferredStore := newStore(b, byName["oncemill-deferred"].pool, postgres.Options{Schema: schema, Table: "records_deferred"})
	for _, name := range versusPlainVariants {
		if _, err := admin.Exec(ctx, "CREATE TABLE "+ident(name+"_ledger")+" (key text PRIMARY KEY, amount int NOT NULL)"); err != nil {
			b.Fatal(err)
		}
	}
	for _, name := range []string{"inbox", "inbox-2rt"} {
		for _, q := range []string{
			"CREATE TABLE " + ident(name+"_keys") + " (key text PRIMARY KEY, created_at timestamptz NOT NULL)",
			"CREATE INDEX ON " + ident(name+"_keys") + " (created_at)",
		} {
			if _, err := admin.Exec(ctx, q); err != nil {
				b.Fatal(err)
			}
		}
	}
	byName["plain"].handle = insertIn(byName["plain"].pool, ident("plain_ledger"))
	byName["inbox"].handle = inboxHandler(byName["inbox"].pool, ident("inbox_keys"), ident("inbox_ledger"))
	byName["inbox-2rt"].handle = inbox2RTHandler(byName["inbox-2rt"].pool, ident("inbox-2rt_keys"), ident("inbox-2rt_ledger"))
	byName["oncemill"].handle = onceHandler(b, onceStore, ident("oncemill_ledger"), false)
	byName["oncemill-deferred"].handle = onceHandler(b, deferredStore, ident("oncemill-deferred_ledger"), true)
	// Each variant's connections, and its statements prepared on each of
	// them, before the first round: warmUpPer messages a handler.
	const warmUpPer = 10
	for _, v := range variants {
		warm(b, v.pool, handlers)
		versusRoundRun(b, handlers, warmUpPer*handlers, v.handle)
	}

	for round := range rounds {
		for j := range variants {
			v := variants[(round+j)%len(variants)] // a different variant leads each round
			before := v.meter.read(b)
			// The round's goroutines inherit the label.
			pprof.Do(ctx, pprof.Labels("variant", v.name), func(ctx context.Context) {
				v.times = append(v.times, versusRoundRun(b, handlers, perRound, v.handle))
			})
			runtime.GC()
			v.spent = v.spent.plus(before, v.meter.read(b))
		}
	}

	for _, tbl := range []string{"records_oncemill", "records_deferred", "inbox_keys", "inbox-2rt_keys", "plain_ledger"} {
		var rows int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+ident(tbl)).Scan(&rows); err != nil {
			b.Fatal(err)
		}
		if want := rounds*perRound + warmUpPer*handlers; rows != want {
			b.Fatalf("%s holds %d rows after %d messages", tbl, rows, want)
		}
	}
	n := rounds * perRound
	if _, _, _, commits := byName["plain"].spent.perMessage(n); commits != 1 {
		b.Fatalf("the plain transaction counted %.3f commits per message, want 1: the counter is wrong", commits)
	}
	rate := func(v *versusVariant) float64 {
		return float64(len(v.times)*perRound) / sumDurations(v.times).Seconds()
	}
	// ratio is the median over rounds [from, to) of a's rate over ref's.
	ratio := func(a, ref string, from, to int) float64 {
		return medianRatio(byName[a].times[from:to], byName[ref].times[from:to])
	}
	ratios := []struct{ metric, a, ref string }{
		{"oncemill/inbox", "oncemill", "inbox"},
		{"deferred/inbox-2rt", "oncemill-deferred", "inbox-2rt"},
		{"inbox/plain", "inbox", "plain"},
		{"inbox-2rt/inbox", "inbox-2rt", "inbox"},
	}
	q := max(rounds/4, 1)
	line := fmt.Sprintf("handlers=%d: %d rounds of %d messages per variant;", handlers, rounds, perRound)
	for _, r := range ratios {
		b.ReportMetric(ratio(r.a, r.ref, 0, rounds), r.metric)
		line += fmt.Sprintf(" %s %.3f (first quarter %.3f, last %.3f);", r.metric, ratio(r.a, r.ref, 0, rounds),
			ratio(r.a, r.ref, 0, q), ratio(r.a, r.ref, rounds-q, rounds))
	}
	for _, v := range variants {
		client, server, rt, commits := v.spent.perMessage(n)
		b.ReportMetric(rate(v), v.name+"-msgs/s")
		b.ReportMetric(client, v.name+"-client-µs/msg")
		if v.spent.serverRead {
			b.ReportMetric(server, v.name+"-server-µs/msg")
		}
		b.ReportMetric(rt, v.name+"-round-trips/msg")
		b.ReportMetric(commits, v.name+"-commits/msg")
		line += fmt.Sprintf(" %s %.0f msgs/s, %s;", v.name, rate(v), v.spent.String(n))
	}
	b.Log(line)
}

// medianRatio is the median over rounds of a's rate over ref's, a[i] and
// ref[i] being what round i took each: a slow spell of the machine that
// falls on a few rounds moves it little.
func medianRatio(a, ref []time.Duration) float64 {
	r := make([]float64, len(a))
	for i := range a {
		r[i] = ref[i].Seconds() / a[i].Seconds()
	}
	slices.Sort(r)
	if len(r)%2 == 1 {
		return r[len(r)/2]
	}
	return (r[len(r)/2-1] + r[len(r)/2]) / 2
}

func sumDurations(ds []time.Duration) time.Duration {
	var sum time.Duration
	for _, d := range ds {
		sum += d
	}
	return sum
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
