package postgres_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/postgres"
)

// BenchmarkPartitionedVersusInbox compares the one-transaction mode on the
// partitioned layout with a hand-written inbox that cleans up after itself,
// on tables that hold a retention window's worth of rows while their
// cleanup runs, in one run. Six variants handle a message whose handler
// inserts one business row through its transaction:
//
//   - plain: a pgx transaction (BEGIN, the INSERT, COMMIT);
//   - inbox: the hand-written inbox: BEGIN sent with INSERT .. ON CONFLICT
//     DO NOTHING into a table with a primary key and a created_at index,
//     the INSERT, COMMIT; a cleaner goroutine deletes the expired rows in
//     batches of 1,000, oldest first, every inboxCleanupEvery;
//   - delete: receiver.NewTransactional on the DELETE layout, its own
//     background cleaner deleting in batches;
//   - partitioned: the same on LayoutPartitioned, its cleaner dropping
//     partitions;
//   - delete-deferred and partitioned-deferred: the last two with
//     WithDeferredClaim(true) (the claim sent with the handler's INSERT),
//     each through its layout's store and pool (the variants take turns,
//     and PostgreSQL's 100 connections do not hold six pools of 18).
//
// Before the first sub-benchmark, the inbox and both records tables are
// filled with retentionRows rows claimed at even steps over the last
// retention window (retentionWindow: 10-minute partitions, 24 to the window,
// as a day's retention has hours), so that rows expire, and the cleaners
// remove them, at the rate a steady stream of retentionRows per window would
// bring (380 a second), for the whole run, while the variants add their own:
// the oldest rows go as the run goes on (a run of about 15 minutes rolls
// over 6% of the window, and every table keeps more than 5M rows). The
// fill's keys and the run's are random hex (md5, hexKey), so every claim
// lands on any page of a unique index, as message UUIDs do. The partitioned
// store's first cleanup pass builds the key filters of the filled partitions
// before the first round. The sub-benchmarks run on those tables in turn,
// each in rounds of the same number of messages per variant, the order
// rotating each round, every layout's variants on a pool of their own. Each
// reports partitioned/inbox and partitioned/plain (msgs/s over the whole
// sub-benchmark), the same for partitioned-deferred, each other oncemill
// variant over the inbox, inbox/plain, every variant's msgs/s, and the
// smallest table of the three at the end (rows-min); its log line adds each
// variant's costs a message, measured on its pool (poolMeter): the client's
// CPU and its own backends', round trips and commits.
//
// Run it once (about 7 minutes on a quiet VM, 2 of them filling the
// tables; 20 minutes or more under load):
//
//	go test -run='^$' -bench=PartitionedVersusInbox -benchtime=1x -timeout=90m ./store/postgres
//
// With -short (scripts/test) the tables hold retentionRowsShort rows and
// the rounds are few and small: a check that it runs, not a figure.
func BenchmarkPartitionedVersusInbox(b *testing.B) {
	env := newRetentionBench(b)
	for _, handlers := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("handlers=%d", handlers), func(b *testing.B) {
			for range b.N {
				env.run(b, handlers)
			}
		})
	}
}

const (
	retentionWindow    = 4 * time.Hour
	retentionRows      = 5_500_000
	retentionRowsShort = 20_000
	inboxRounds        = 20
	inboxRound         = 2_000
	inboxRoundsShort   = 4
	inboxRoundShort    = 200
	// inboxCleanupEvery is how often the hand-written cleaner looks for
	// expired rows, and the oncemill stores' CleanupInterval.
	inboxCleanupEvery = 10 * time.Second
)

// retentionBench is the setup BenchmarkPartitionedVersusInbox's
// sub-benchmarks share: the tables, filled once, and the cleaners, running
// until the benchmark ends.
type retentionBench struct {
	schema string
	admin  *pgxpool.Pool
	// Every variant's pool, sized for the most handlers; each sub-benchmark
	// warms it to its own count.
	pools  map[string]*pgxpool.Pool
	meters map[string]*poolMeter
	// The variants, in the order of the first round.
	variants []*versusVariant
}

// retentionVariants are the variants' names, each also the name of its
// business table (name_ledger), and their pools.
var (
	retentionVariants = []string{"plain", "inbox", "delete", "partitioned", "delete-deferred", "partitioned-deferred"}
	retentionPools    = map[string]string{
		"plain": "plain", "inbox": "inbox",
		"delete": "delete", "delete-deferred": "delete",
		"partitioned": "partitioned", "partitioned-deferred": "partitioned",
	}
)

func newRetentionBench(b *testing.B) *retentionBench {
	ctx := b.Context()
	rows := retentionRows
	if testing.Short() {
		rows = retentionRowsShort
	}
	env := &retentionBench{admin: testenv.Pool(b), pools: map[string]*pgxpool.Pool{}, meters: map[string]*poolMeter{}}
	env.schema = testenv.Schema(b, env.admin)
	for _, name := range []string{"plain", "inbox", "delete", "partitioned"} {
		env.pools[name], env.meters[name] = meteredPool(b, 16+2) // and the cleaner
	}
	// The stores: rows purge a window after their claim, the cleaners run
	// every inboxCleanupEvery once the tables are filled (the stores that
	// migrate them have none).
	opts := postgres.Options{Schema: env.schema, Retention: retentionWindow}
	deleteOpts := opts
	deleteOpts.Table = "records_delete"
	newStore(b, env.admin, deleteOpts)
	partOpts := opts
	partOpts.Table, partOpts.Layout = "records_partitioned", postgres.LayoutPartitioned
	newStore(b, env.admin, partOpts)
	ident := func(name string) string { return pgx.Identifier{env.schema, name}.Sanitize() }
	for _, q := range []string{
		"CREATE TABLE " + ident("inbox") + " (key text PRIMARY KEY, created_at timestamptz NOT NULL)",
		"CREATE INDEX ON " + ident("inbox") + " (created_at)",
	} {
		if _, err := env.admin.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
	}
	for _, name := range retentionVariants {
		if _, err := env.admin.Exec(ctx, "CREATE TABLE "+ident(name+"_ledger")+" (key text PRIMARY KEY, amount int NOT NULL)"); err != nil {
			b.Fatal(err)
		}
	}

	start := dbNow(b, env.admin)
	fillStart := time.Now()
	fillRetentionWindow(b, env, rows, start)
	b.Logf("filled the inbox and both records tables with %d rows each in %v", rows, time.Since(fillStart).Round(time.Second))
	deleteOpts.CleanupInterval, partOpts.CleanupInterval = inboxCleanupEvery, inboxCleanupEvery
	deleteStore := newStore(b, env.pools["delete"], deleteOpts)
	partStore := newStore(b, env.pools["partitioned"], partOpts)
	// The partitioned store's first cleanup pass builds the key filters of
	// the filled partitions, closed for a minute, and loads them.
	filterStart := time.Now()
	closed := 0
	for _, p := range partsOf(b, env.admin, env.schema, "records_partitioned") {
		if p.upper.Add(time.Minute).Before(start) {
			closed++
		}
	}
	testenv.WaitFor(b, 10*time.Minute, "the key filters of the filled partitions", func() bool {
		return partStore.KeyFilters() >= closed
	})
	b.Logf("built and loaded the key filters of %d partitions in %v", closed, time.Since(filterStart).Round(time.Second))

	handlers := map[string]func(context.Context, string) error{
		"plain":                insertIn(env.pools["plain"], ident("plain_ledger")),
		"inbox":                inboxHandler(env.pools["inbox"], ident("inbox"), ident("inbox_ledger")),
		"delete":               onceHandler(b, deleteStore, ident("delete_ledger"), false),
		"partitioned":          onceHandler(b, partStore, ident("partitioned_ledger"), false),
		"delete-deferred":      onceHandler(b, deleteStore, ident("delete-deferred_ledger"), true),
		"partitioned-deferred": onceHandler(b, partStore, ident("partitioned-deferred_ledger"), true),
	}
	for _, name := range retentionVariants {
		env.variants = append(env.variants, &versusVariant{name: name, handle: handlers[name], pool: env.pools[retentionPools[name]], meter: env.meters[retentionPools[name]]})
	}

	// The hand-written cleaner, until the benchmark ends.
	cleanerCtx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { inboxCleaner(cleanerCtx, b, env.pools["inbox"], ident("inbox")) })
	b.Cleanup(func() { stop(); wg.Wait() })
	env.warmUp(b)
	return env
}

// warmUpFor is how long every variant runs, in turns, before the first
// measured round. In the first 15–20 s after the fill, every variant's
// rounds but plain's took 2–3 times their median (two runs of 2026-11-27,
// at one handler), and the first sub-benchmark's sums weighed those rounds
// on whichever variants the rotation gave them to.
const warmUpFor = 30 * time.Second

// warmUp runs rounds of every variant in turn, at one handler, for
// warmUpFor (one rotation with -short), and counts none of them.
func (env *retentionBench) warmUp(b *testing.B) {
	perRound := inboxRound
	if testing.Short() {
		perRound = inboxRoundShort
	}
	start := time.Now()
	rounds := 0
	for {
		for _, v := range env.variants {
			versusRoundRun(b, 1, perRound, v.handle)
			rounds++
		}
		if testing.Short() || time.Since(start) >= warmUpFor {
			break
		}
	}
	b.Logf("warmed up: %d rounds in %v", rounds, time.Since(start).Round(time.Second))
}

// fillRetentionWindow puts rows rows into the inbox and each records table,
// claimed at even steps over the window before start, each expiring and
// purged a window after its claim, as the variants' own writes do. The
// partitioned table gets the partitions of the past window first, named as
// the store names its own.
func fillRetentionWindow(b *testing.B, env *retentionBench, rows int, start time.Time) {
	ctx := b.Context()
	width := retentionWindow / 24
	oldest := partsOf(b, env.admin, env.schema, "records_partitioned")[0].lower
	for lower := start.Add(-retentionWindow).Truncate(width); lower.Before(oldest); lower = lower.Add(width) {
		name := "records_partitioned_p" + lower.UTC().Format("200601021504")
		upper := lower.Add(width)
		if upper.After(oldest) {
			upper = oldest
		}
		q := fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s') WITH (fillfactor = 80)",
			pgx.Identifier{env.schema, name}.Sanitize(), table(env.schema, "records_partitioned"),
			lower.UTC().Format(time.RFC3339Nano), upper.UTC().Format(time.RFC3339Nano))
		if _, err := env.admin.Exec(ctx, q); err != nil {
			b.Fatal(err)
		}
		if _, err := env.admin.Exec(ctx, "CREATE UNIQUE INDEX ON "+pgx.Identifier{env.schema, name}.Sanitize()+" (scope, key)"); err != nil {
			b.Fatal(err) // as the store's partitions have
		}
	}
	// Row i was claimed at start - window + i*step; md5 keys land on random
	// pages of the unique indexes, as message UUIDs and the run's own keys
	// (hexKey) do.
	claimed := fmt.Sprintf("$1::timestamptz - interval '%d microseconds' + i * interval '%d microseconds'",
		retentionWindow.Microseconds(), (retentionWindow / time.Duration(rows)).Microseconds())
	window := fmt.Sprintf("interval '%d microseconds'", retentionWindow.Microseconds())
	records := func(tbl, claimedCol, claimedVal string) string {
		return fmt.Sprintf(`INSERT INTO %s (scope, key, fingerprint, status, token, attempt, taken_over,
			expires_at, purge_at, created_at, updated_at, message_uuid%s)
			SELECT 'bench', md5(i::text), '', 2, i, 1, false, c + %s, c + %s, c, c, md5(i::text)::uuid::text%s
			FROM generate_series(1, %d) i, LATERAL (SELECT %s AS c) x`,
			table(env.schema, tbl), claimedCol, window, window, claimedVal, rows, claimed)
	}
	var wg sync.WaitGroup
	for _, q := range []string{
		fmt.Sprintf("INSERT INTO %s (key, created_at) SELECT md5(i::text), %s FROM generate_series(1, %d) i",
			pgx.Identifier{env.schema, "inbox"}.Sanitize(), claimed, rows),
		records("records_delete", "", ""),
		records("records_partitioned", ", claimed_at", ", c"),
	} {
		wg.Go(func() {
			if _, err := env.admin.Exec(ctx, q, start); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	if b.Failed() {
		b.FailNow()
	}
	for _, tbl := range []string{"inbox", "records_delete", "records_partitioned"} {
		if _, err := env.admin.Exec(ctx, "VACUUM ANALYZE "+pgx.Identifier{env.schema, tbl}.Sanitize()); err != nil {
			b.Fatal(err)
		}
	}
	if _, err := env.admin.Exec(ctx, "CHECKPOINT"); err != nil {
		b.Fatal(err)
	}
}

// partsOf lists the partitions of tbl, oldest first.
func partsOf(tb testing.TB, pool *pgxpool.Pool, schema, tbl string) []part {
	tb.Helper()
	rows, err := pool.Query(tb.Context(), `
		SELECT c.relname::text, coalesce(m[1]::timestamptz, '0001-01-01 00:00:00+00'), m[2]::timestamptz
		FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
		CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, 0), 'FROM \((?:''([^'']*)''|MINVALUE)\) TO \(''([^'']*)''\)') m
		WHERE i.inhparent = to_regclass($1) ORDER BY 2`, table(schema, tbl))
	if err != nil {
		tb.Fatal(err)
	}
	ps, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (part, error) {
		var p part
		return p, r.Scan(&p.name, &p.lower, &p.upper)
	})
	if err != nil {
		tb.Fatal(err)
	}
	return ps
}

// insertIn is the plain variant: one business row in a pgx transaction.
func insertIn(pool *pgxpool.Pool, ledger string) func(context.Context, string) error {
	insert := "INSERT INTO " + ledger + " (key, amount) VALUES ($1, 100)"
	return func(ctx context.Context, key string) error {
		tx, err := pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
		if _, err := tx.Exec(ctx, insert, key); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

// inboxHandler is the hand-written inbox, as cheap as pgx allows: BEGIN
// and the inbox row in one round trip, the business row, COMMIT.
func inboxHandler(pool *pgxpool.Pool, inbox, ledger string) func(context.Context, string) error {
	claim := "INSERT INTO " + inbox + " (key, created_at) VALUES ($1, now()) ON CONFLICT DO NOTHING"
	insert := "INSERT INTO " + ledger + " (key, amount) VALUES ($1, 100)"
	return func(ctx context.Context, key string) error {
		batch := &pgx.Batch{}
		batch.BeginTx(pgx.TxOptions{})
		batch.Queue(claim, key)
		br := pool.SendBatch(ctx, batch)
		_, err := br.Exec()
		if err == nil {
			var tag pgconn.CommandTag
			tag, err = br.Exec()
			if err == nil && tag.RowsAffected() == 0 {
				err = fmt.Errorf("inbox: key %s seen twice", key)
			}
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		tx := br.Tx()
		defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
		if err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, insert, key); err != nil {
			return err
		}
		return tx.Commit(ctx)
	}
}

// inbox2RTHandler is the hand-written inbox in two round trips, as a
// consumer who runs the handler's statement before knowing the key is new
// would write it: BEGIN, the inbox row and the business row in one batch,
// then COMMIT, or ROLLBACK when the inbox row was there (which undoes the
// business row).
func inbox2RTHandler(pool *pgxpool.Pool, inbox, ledger string) func(context.Context, string) error {
	claim := "INSERT INTO " + inbox + " (key, created_at) VALUES ($1, now()) ON CONFLICT DO NOTHING"
	insert := "INSERT INTO " + ledger + " (key, amount) VALUES ($1, 100)"
	return func(ctx context.Context, key string) error {
		batch := &pgx.Batch{}
		batch.BeginTx(pgx.TxOptions{})
		batch.Queue(claim, key)
		batch.Queue(insert, key)
		br := pool.SendBatch(ctx, batch)
		var tag pgconn.CommandTag
		_, err := br.Exec()
		if err == nil {
			tag, err = br.Exec()
		}
		if err == nil {
			_, err = br.Exec()
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
			return fmt.Errorf("inbox: key %s seen twice", key) // the rollback undoes the business row
		}
		return tx.Commit(ctx)
	}
}

// inboxCleaner is the inbox's hand-written cleanup: every
// inboxCleanupEvery, DELETE the oldest 1,000 expired rows until none is
// left.
func inboxCleaner(ctx context.Context, b *testing.B, pool *pgxpool.Pool, inbox string) {
	del := fmt.Sprintf(`DELETE FROM %[1]s WHERE key IN (
		SELECT key FROM %[1]s WHERE created_at < now() - interval '%[2]d microseconds' ORDER BY created_at LIMIT 1000)`,
		inbox, retentionWindow.Microseconds())
	t := time.NewTicker(inboxCleanupEvery)
	defer t.Stop()
	for {
		for {
			tag, err := pool.Exec(ctx, del)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				b.Error(err)
				return
			}
			if tag.RowsAffected() < 1000 {
				break
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// onceHandler is the one-transaction mode on st around the business insert,
// with a success kept for the retention window, and the claim deferred or
// not.
func onceHandler(b *testing.B, st *postgres.Store, ledger string, deferred bool) func(context.Context, string) error {
	r, err := receiver.NewTransactional(st).WithDeferredClaim(deferred).WithScope("bench").WithPolicy(policy.Policy{SuccessTTL: retentionWindow}).Build()
	if err != nil {
		b.Fatal(err)
	}
	insert := "INSERT INTO " + ledger + " (key, amount) VALUES ($1, 100)"
	h := r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), insert, msg.UUID)
		return nil, err
	})
	payload := []byte(`{"amount":100}`)
	return func(_ context.Context, key string) error {
		_, err := h(message.NewMessage(key, payload))
		return err
	}
}

// run is one sub-benchmark: rounds of every variant in rotated order.
func (env *retentionBench) run(b *testing.B, handlers int) {
	rounds, perRound := inboxRounds, inboxRound
	if testing.Short() {
		rounds, perRound = inboxRoundsShort, inboxRoundShort
	}
	variants := env.variants
	for _, v := range variants {
		v.times, v.spent = nil, meterSpent{}
		warm(b, v.pool, handlers)
	}
	type roundAt struct {
		v     *versusVariant
		round int
		at    time.Duration
	}
	var order []roundAt
	start := time.Now()
	for round := range rounds {
		for j := range variants {
			v := variants[(round+j)%len(variants)]
			order = append(order, roundAt{v, len(v.times), time.Since(start)})
			before := v.meter.read(b)
			v.times = append(v.times, versusRoundRun(b, handlers, perRound, v.handle))
			v.spent = v.spent.plus(before, v.meter.read(b))
		}
	}
	rates := map[string]float64{}
	medians := map[string]time.Duration{}
	slowest := ""
	for _, v := range variants {
		var sum, longest time.Duration
		for _, d := range v.times {
			sum += d
			longest = max(longest, d)
		}
		rates[v.name] = float64(len(v.times)*perRound) / sum.Seconds()
		medians[v.name] = percentile(v.times, 0.5)
		slowest += fmt.Sprintf(" %s %v/%v/%v", v.name, longest.Round(time.Millisecond), medians[v.name].Round(time.Millisecond), (sum / time.Duration(len(v.times))).Round(time.Millisecond))
	}
	rowsMin := -1
	for _, tbl := range []string{"inbox", "records_delete", "records_partitioned"} {
		var n int
		if err := env.admin.QueryRow(b.Context(), "SELECT count(*) FROM "+pgx.Identifier{env.schema, tbl}.Sanitize()).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if rowsMin < 0 || n < rowsMin {
			rowsMin = n
		}
	}
	plain, inbox := rates["plain"], rates["inbox"]
	line := fmt.Sprintf("handlers=%d: %d rounds of %d messages per variant; inbox/plain %.3f", handlers, rounds, perRound, inbox/plain)
	for _, name := range retentionVariants[2:] {
		b.ReportMetric(rates[name]/inbox, name+"/inbox")
		line += fmt.Sprintf(", %s/inbox %.3f", name, rates[name]/inbox)
	}
	for _, name := range []string{"partitioned", "partitioned-deferred"} {
		b.ReportMetric(rates[name]/plain, name+"/plain")
		line += fmt.Sprintf(", %s/plain %.3f", name, rates[name]/plain)
	}
	b.ReportMetric(inbox/plain, "inbox/plain")
	line += "; msgs/s"
	for _, name := range retentionVariants {
		b.ReportMetric(rates[name], name+"-msgs/s")
		line += fmt.Sprintf(" %s %.0f", name, rates[name])
	}
	b.ReportMetric(float64(rowsMin), "rows-min")
	// The ratios of the median rounds, beside those of the whole run: a
	// round that a stall of the VM stretched weighs on its variant's sum
	// alone (the log only; the metrics are the whole run's).
	line += fmt.Sprintf("; by median round partitioned-deferred/inbox %.3f, delete-deferred/inbox %.3f",
		medians["inbox"].Seconds()/medians["partitioned-deferred"].Seconds(), medians["inbox"].Seconds()/medians["delete-deferred"].Seconds())
	// The rounds that took twice their variant's median, and when: a stall
	// of the machine stretches whichever variant's round it falls in.
	slow := ""
	for _, r := range order {
		if took := r.v.times[r.round]; took > 2*medians[r.v.name] {
			slow += fmt.Sprintf(" %s %v at %v,", r.v.name, took.Round(time.Millisecond), r.at.Round(time.Second))
		}
	}
	// Where a message's time went: the client's CPU, the server's, and the
	// round trips and commits of its pool (poolMeter).
	cpu := ""
	for _, v := range variants {
		cpu += fmt.Sprintf(" %s: %s;", v.name, v.spent.String(len(v.times)*perRound))
	}
	b.Logf("%s; smallest table %d rows; slowest/median/mean round%s; rounds over twice their median:%s; a message's costs:%s", line, rowsMin, slowest, slow, cpu)
}
