package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// BenchmarkWatermarkVersusPlain compares the watermark mode on Kafka with
// the plain pgx transaction a hand-written consumer would use, and with
// oncemill's key mode (receiver.NewTransactional on the DELETE layout,
// keyed by message UUID), in one run, the method of
// BenchmarkTransactionalVersusPlain: each handler inserts one business row
// through its transaction; the three variants take turns in rounds of the
// same number of messages, the order rotating each round, each on a pool of
// its own warmed to the partition count, from freshly made tables. Each
// partition has its own handler goroutine, which delivers its partition's
// offsets in order, as a Watermill Kafka subscriber does. It reports, per
// partition count:
//
//   - watermark/plain and watermark/keymode: the watermark mode's msgs/s
//     over the other two's, over the whole run;
//   - commits/msg and round-trips/msg of the watermark mode, counted on its
//     pool's connections;
//   - wm-rows: the rows of the watermark table at the end (one per
//     partition), and wm-bytes its total size, after every message;
//   - msgs/s of each variant.
//
// Run it once (about 6 minutes):
//
//	go test -run='^$' -bench=WatermarkVersusPlain -benchtime=1x -timeout=30m ./store/postgres
//
// With -short (scripts/test) it runs versusRoundsShort rounds of
// versusRoundShort messages: a check that it runs, not a figure.
func BenchmarkWatermarkVersusPlain(b *testing.B) {
	for _, partitions := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("partitions=%d", partitions), func(b *testing.B) {
			for range b.N {
				watermarkVersusPlain(b, partitions)
			}
		})
	}
}

// wmVariant is one way of handling a message at (partition, offset), with
// the pool it runs on and the tracer counting that pool's statements.
type wmVariant struct {
	name   string
	handle func(ctx context.Context, partition int, offset int64, key string) error
	pool   *pgxpool.Pool
	count  *statementCounter
	times  []time.Duration
	counts []statementCounts
}

func watermarkVersusPlain(b *testing.B, partitions int) {
	ctx := b.Context()
	rounds, perRound := versusRounds, versusRound
	if testing.Short() {
		rounds, perRound = versusRoundsShort, versusRoundShort
	}
	perRound -= perRound % partitions
	tracedPool := func() (*pgxpool.Pool, *statementCounter) {
		c := &statementCounter{}
		return testenv.Pool(b, func(cfg *pgxpool.Config) {
			cfg.MaxConns = int32(partitions)
			cfg.ConnConfig.Tracer = c
		}), c
	}
	plainPool, plainCount := tracedPool()
	keyPool, keyCount := tracedPool()
	wmPool, wmCount := tracedPool()
	schema := testenv.Schema(b, plainPool)
	keySt := newStore(b, keyPool, postgres.Options{Schema: schema})
	wmSt := newStore(b, wmPool, postgres.Options{Schema: schema, Table: "wm_records"})
	tables := map[string]string{}
	for _, name := range []string{"plain", "keymode", "watermark"} {
		tables[name] = pgx.Identifier{schema, name + "_ledger"}.Sanitize()
		if _, err := plainPool.Exec(ctx, "CREATE TABLE "+tables[name]+" (key text PRIMARY KEY, amount int NOT NULL)"); err != nil {
			b.Fatal(err)
		}
	}
	insert := func(name string) string { return "INSERT INTO " + tables[name] + " (key, amount) VALUES ($1, 100)" }
	plainInsert, keyInsert, wmInsert := insert("plain"), insert("keymode"), insert("watermark")

	plain := func(ctx context.Context, _ int, _ int64, key string) error {
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
	handler := func(sql string) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			tx, _ := postgres.TxFromContext(msg.Context())
			_, err := tx.Exec(msg.Context(), sql, msg.UUID)
			return nil, err
		}
	}
	keyR, err := receiver.NewTransactional(keySt).WithScope("bench").Build()
	if err != nil {
		b.Fatal(err)
	}
	keyH := keyR.Middleware(handler(keyInsert))
	wmR, err := receiver.NewTransactional(wmSt).WithKafkaWatermark(pipeline.KafkaWatermark{
		Group:    "bench",
		Position: wmPosition,
		HighWaterMark: func(context.Context, string, int32) (int64, error) {
			return 1 << 62, nil
		},
	}).Build()
	if err != nil {
		b.Fatal(err)
	}
	wmH := wmR.Middleware(handler(wmInsert))
	payload := []byte(`{"amount":100}`)
	keymode := func(_ context.Context, _ int, _ int64, key string) error {
		_, err := keyH(message.NewMessage(key, payload))
		return err
	}
	watermark := func(_ context.Context, partition int, offset int64, key string) error {
		msg := message.NewMessage(key, payload)
		msg.Metadata.Set("partition", strconv.Itoa(partition))
		msg.Metadata.Set("offset", strconv.FormatInt(offset, 10))
		_, err := wmH(msg)
		return err
	}

	variants := []*wmVariant{
		{name: "plain", handle: plain, pool: plainPool, count: plainCount},
		{name: "keymode", handle: keymode, pool: keyPool, count: keyCount},
		{name: "watermark", handle: watermark, pool: wmPool, count: wmCount},
	}
	for _, v := range variants {
		warm(b, v.pool, partitions)
	}
	var offset int64 // the partitions' next offset: each gets perRound/partitions a round
	for round := range rounds {
		for j := range variants {
			v := variants[(round+j)%len(variants)]
			before := v.count.load()
			v.times = append(v.times, wmRoundRun(b, partitions, perRound/partitions, offset, v.handle))
			v.counts = append(v.counts, v.count.load().minus(before))
		}
		offset += int64(perRound / partitions)
	}
	plainV, keyV, wmV := variants[0], variants[1], variants[2]
	total := rounds * perRound
	for name, t := range tables {
		var n int
		if err := plainPool.QueryRow(ctx, "SELECT count(*) FROM "+t).Scan(&n); err != nil {
			b.Fatal(err)
		}
		if n != total {
			b.Fatalf("%s: the ledger holds %d rows after %d messages", name, n, total)
		}
	}
	wmTable := pgx.Identifier{schema, "wm_records_watermarks"}.Sanitize()
	var wmRows int
	var wmBytes int64
	if err := plainPool.QueryRow(ctx, "SELECT count(*), pg_total_relation_size($1) FROM "+wmTable, wmTable).Scan(&wmRows, &wmBytes); err != nil {
		b.Fatal(err)
	}
	if wmRows != partitions {
		b.Fatalf("the watermark table holds %d rows after %d messages on %d partitions", wmRows, total, partitions)
	}
	rate := func(ds []time.Duration) float64 {
		var sum time.Duration
		for _, d := range ds {
			sum += d
		}
		return float64(len(ds)*perRound) / sum.Seconds()
	}
	perMsg := func(v *wmVariant) statementCounts {
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
	vsPlain := rate(wmV.times) / rate(plainV.times)
	vsKey := rate(wmV.times) / rate(keyV.times)
	wc := perMsg(wmV)
	b.ReportMetric(vsPlain, "watermark/plain")
	b.ReportMetric(vsKey, "watermark/keymode")
	b.ReportMetric(wc.commits, "commits/msg")
	b.ReportMetric(wc.roundTrips, "round-trips/msg")
	b.ReportMetric(float64(wmRows), "wm-rows")
	b.ReportMetric(float64(wmBytes), "wm-bytes")
	b.ReportMetric(rate(plainV.times), "plain-msgs/s")
	b.ReportMetric(rate(keyV.times), "keymode-msgs/s")
	b.ReportMetric(rate(wmV.times), "watermark-msgs/s")
	b.Logf("partitions=%d: %d rounds of %d messages per variant; plain %.0f msgs/s, key mode %.0f msgs/s, watermark %.0f msgs/s: %.3f of plain, %.3f of the key mode; %.3f commits and %.3f round trips per message; watermark table %d rows, %d bytes",
		partitions, rounds, perRound, rate(plainV.times), rate(keyV.times), rate(wmV.times), vsPlain, vsKey, wc.commits, wc.roundTrips, wmRows, wmBytes)
}

// wmRoundRun runs one round of a variant: one goroutine per partition
// delivers n messages, at offsets from first on, in order, each with a
// fresh random key; it returns how long the messages took.
func wmRoundRun(b *testing.B, partitions, n int, first int64, handle func(context.Context, int, int64, string) error) time.Duration {
	ctx := b.Context()
	keys := make([][]string, partitions)
	for p := range keys {
		keys[p] = make([]string, n)
		for i := range keys[p] {
			keys[p][i] = rand.Text()
		}
	}
	var wg sync.WaitGroup
	start := time.Now()
	for p := range partitions {
		wg.Go(func() {
			for i, key := range keys[p] {
				if err := handle(ctx, p, first+int64(i), key); err != nil {
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

// BenchmarkWatermarkStorage sends 1,000,000 messages through the watermark
// mode (16 partitions, each its own handler delivering its offsets in
// order, no business write) and reports the watermark table's rows and
// size every 250,000 messages: one row per partition, and a size that does
// not grow with the message count (wm-bytes-first, wm-bytes-last: after the
// first and the last quarter). The messages go through the store's claims
// and commits directly, without the stage: the table is what is measured.
//
//	go test -run='^$' -bench=WatermarkStorage -benchtime=1x -timeout=60m ./store/postgres
//
// With -short it sends 1,600: a check that it runs.
func BenchmarkWatermarkStorage(b *testing.B) {
	for range b.N {
		watermarkStorage(b)
	}
}

func watermarkStorage(b *testing.B) {
	const partitions = 16
	total := 1_000_000
	if testing.Short() {
		total = 1_600
	}
	ctx := b.Context()
	pool := testenv.Pool(b, func(cfg *pgxpool.Config) { cfg.MaxConns = partitions + 2 })
	schema := testenv.Schema(b, pool)
	st := newStore(b, pool, postgres.Options{Schema: schema})
	wts, err := st.KafkaWatermarks("storage", func(context.Context, string, int32) (int64, error) { return 1 << 62, nil })
	if err != nil {
		b.Fatal(err)
	}
	wmTable := pgx.Identifier{schema, postgres.DefaultTable + "_watermarks"}.Sanitize()
	size := func() (rows int, bytes int64) {
		if err := pool.QueryRow(ctx, "SELECT count(*), pg_total_relation_size($1) FROM "+wmTable, wmTable).Scan(&rows, &bytes); err != nil {
			b.Fatal(err)
		}
		return rows, bytes
	}
	perPartition := total / partitions
	quarter := perPartition / 4
	var sizes []int64
	start := time.Now()
	for q := range 4 {
		var wg sync.WaitGroup
		for p := range partitions {
			wg.Go(func() {
				for o := q * quarter; o < (q+1)*quarter; o++ {
					key := fmt.Sprintf("orders/%d/%d", p, o)
					res, err := wts.ClaimInTx(ctx, store.TxRequest{Scope: "storage", Key: key, SuccessTTL: time.Hour, Wait: time.Second})
					if err == nil && res.Decision != store.DecisionExecute {
						err = fmt.Errorf("%s: decision %v", key, res.Decision)
					}
					if err == nil {
						err = res.Tx.Commit(ctx, nil)
					}
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if b.Failed() {
			b.FailNow()
		}
		rows, bytes := size()
		if rows != partitions {
			b.Fatalf("after %d messages the watermark table holds %d rows, want %d", (q+1)*quarter*partitions, rows, partitions)
		}
		sizes = append(sizes, bytes)
	}
	msgs := 4 * quarter * partitions
	b.ReportMetric(float64(partitions), "wm-rows")
	b.ReportMetric(float64(sizes[0]), "wm-bytes-first")
	b.ReportMetric(float64(sizes[3]), "wm-bytes-last")
	b.ReportMetric(float64(msgs)/time.Since(start).Seconds(), "msgs/s")
	b.Logf("%d messages on %d partitions: %d rows; table and index %d bytes after the first quarter, %d, %d and %d after the others",
		msgs, partitions, partitions, sizes[0], sizes[1], sizes[2], sizes[3])
}
