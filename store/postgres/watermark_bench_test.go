package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"runtime"
	"runtime/pprof"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// BenchmarkWatermarkVersusPlain compares the watermark mode on Kafka with
// the hand-written code that does the same work, in one run, the method of
// BenchmarkTransactionalVersusPlain: each handler inserts one business row
// through its transaction; the variants take turns in rounds of the same
// number of messages, the order rotating each round, each on a pool of its
// own (meteredPool) warmed to the partition count, writing tables of its
// own that start empty. Each partition has its own handler goroutine, which
// delivers its partition's offsets in order, as a Watermill Kafka
// subscriber does. The variants:
//
//   - plain: BEGIN, the INSERT, COMMIT: no offset tracked, the ceiling;
//   - keymode: receiver.NewTransactional on the DELETE layout, keyed by
//     message UUID;
//   - floor: the hand-written watermark in the watermark mode's two round
//     trips (floorHandler): BEGIN with the INSERT, then a guarded UPDATE of
//     the partition's row sent with COMMIT;
//   - watermark: receiver.NewTransactional with WithKafkaWatermark.
//
// It reports, per partition count, throughput ratios as the median over
// the rounds of the two variants' rates in that round: watermark/floor,
// watermark/plain and watermark/keymode; and per variant, over its rounds,
// <variant>-msgs/s and per message <variant>-client-µs/msg,
// <variant>-server-µs/msg, <variant>-round-trips/msg and
// <variant>-commits/msg (see BenchmarkTransactionalVersusPlain); wm-rows,
// the rows of the watermark table at the end (one per partition), and
// wm-bytes its total size. Every goroutine of a variant's rounds carries the
// pprof label variant=<name>, for a CPU profile's -tagfocus.
//
// Run it once (about 3 minutes on a 2-core machine):
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

// wmVariants are BenchmarkWatermarkVersusPlain's variants, in the order of
// the first round; each name is also its ledger's prefix.
var wmVariants = []string{"plain", "keymode", "floor", "watermark"}

// wmVariant is one way of handling a message at (partition, offset), with
// the pool it runs on, that pool's meter, and what its rounds took and
// spent.
type wmVariant struct {
	name   string
	handle func(ctx context.Context, partition int, offset int64, key string) error
	pool   *pgxpool.Pool
	meter  *poolMeter
	times  []time.Duration
	spent  meterSpent
}

func watermarkVersusPlain(b *testing.B, partitions int) {
	ctx := b.Context()
	rounds, perRound := versusRounds, versusRound
	if testing.Short() {
		rounds, perRound = versusRoundsShort, versusRoundShort
	}
	perRound -= perRound % partitions
	admin := testenv.Pool(b)
	schema := testenv.Schema(b, admin)
	ident := func(name string) string { return pgx.Identifier{schema, name}.Sanitize() }
	variants := make([]*wmVariant, len(wmVariants))
	byName := map[string]*wmVariant{}
	for i, name := range wmVariants {
		pool, meter := meteredPool(b, partitions)
		variants[i] = &wmVariant{name: name, pool: pool, meter: meter}
		byName[name] = variants[i]
	}
	keySt := newStore(b, byName["keymode"].pool, postgres.Options{Schema: schema})
	wmSt := newStore(b, byName["watermark"].pool, postgres.Options{Schema: schema, Table: "wm_records"})
	for _, name := range wmVariants {
		if _, err := admin.Exec(ctx, "CREATE TABLE "+ident(name+"_ledger")+" (key text PRIMARY KEY, amount int NOT NULL)"); err != nil {
			b.Fatal(err)
		}
	}
	floorTable := ident("floor_watermarks")
	if _, err := admin.Exec(ctx, "CREATE TABLE "+floorTable+` (group_id text, topic text, partition int4, next_offset int8 NOT NULL,
		PRIMARY KEY (group_id, topic, partition))`); err != nil {
		b.Fatal(err)
	}
	if _, err := admin.Exec(ctx, "INSERT INTO "+floorTable+" SELECT 'bench', 'orders', p, 0 FROM generate_series(0, $1::int - 1) AS p", partitions); err != nil {
		b.Fatal(err)
	}

	plain := insertIn(byName["plain"].pool, ident("plain_ledger"))
	byName["plain"].handle = func(ctx context.Context, _ int, _ int64, key string) error { return plain(ctx, key) }
	byName["floor"].handle = floorHandler(byName["floor"].pool, floorTable, ident("floor_ledger"))
	handler := func(sql string) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			tx, _ := postgres.TxFromContext(msg.Context())
			_, err := tx.Exec(msg.Context(), sql, msg.UUID)
			return nil, err
		}
	}
	insert := func(name string) string {
		return "INSERT INTO " + ident(name+"_ledger") + " (key, amount) VALUES ($1, 100)"
	}
	keyR, err := receiver.NewTransactional(keySt).WithScope("bench").Build()
	if err != nil {
		b.Fatal(err)
	}
	keyH := keyR.Middleware(handler(insert("keymode")))
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
	wmH := wmR.Middleware(handler(insert("watermark")))
	payload := []byte(`{"amount":100}`)
	byName["keymode"].handle = func(_ context.Context, _ int, _ int64, key string) error {
		_, err := keyH(message.NewMessage(key, payload))
		return err
	}
	byName["watermark"].handle = func(_ context.Context, partition int, offset int64, key string) error {
		msg := message.NewMessage(key, payload)
		msg.Metadata.Set("partition", strconv.Itoa(partition))
		msg.Metadata.Set("offset", strconv.FormatInt(offset, 10))
		_, err := wmH(msg)
		return err
	}

	// Each variant's connections, and its statements prepared on each of
	// them, before the first round: warmUpPer offsets a partition.
	const warmUpPer = 10
	for _, v := range variants {
		warm(b, v.pool, partitions)
		wmRoundRun(b, partitions, warmUpPer, 0, v.handle)
	}
	offset := int64(warmUpPer) // the partitions' next offset: each gets perRound/partitions a round
	for round := range rounds {
		for j := range variants {
			v := variants[(round+j)%len(variants)]
			before := v.meter.read(b)
			pprof.Do(ctx, pprof.Labels("variant", v.name), func(context.Context) {
				v.times = append(v.times, wmRoundRun(b, partitions, perRound/partitions, offset, v.handle))
			})
			runtime.GC()
			v.spent = v.spent.plus(before, v.meter.read(b))
		}
		offset += int64(perRound / partitions)
	}
	n := rounds * perRound
	for _, name := range wmVariants {
		var rows int
		if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+ident(name+"_ledger")).Scan(&rows); err != nil {
			b.Fatal(err)
		}
		if want := n + warmUpPer*partitions; rows != want {
			b.Fatalf("%s: the ledger holds %d rows after %d messages", name, rows, want)
		}
	}
	var floorBehind int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM "+floorTable+" WHERE next_offset <> $1", offset).Scan(&floorBehind); err != nil || floorBehind != 0 {
		b.Fatalf("%d partitions of the floor's watermarks are not at offset %d (%v)", floorBehind, offset, err)
	}
	wmTable := ident("wm_records_watermarks")
	var wmRows int
	var wmBytes int64
	if err := admin.QueryRow(ctx, "SELECT count(*), pg_total_relation_size($1) FROM "+wmTable, wmTable).Scan(&wmRows, &wmBytes); err != nil {
		b.Fatal(err)
	}
	if wmRows != partitions {
		b.Fatalf("the watermark table holds %d rows after %d messages on %d partitions", wmRows, n, partitions)
	}
	if _, _, _, commits := byName["plain"].spent.perMessage(n); commits != 1 {
		b.Fatalf("the plain transaction counted %.3f commits per message, want 1: the counter is wrong", commits)
	}
	line := fmt.Sprintf("partitions=%d: %d rounds of %d messages per variant;", partitions, rounds, perRound)
	for _, ref := range []string{"floor", "plain", "keymode"} {
		r := medianRatio(byName["watermark"].times, byName[ref].times)
		b.ReportMetric(r, "watermark/"+ref)
		line += fmt.Sprintf(" watermark/%s %.3f;", ref, r)
	}
	for _, v := range variants {
		client, server, rt, commits := v.spent.perMessage(n)
		rate := float64(n) / sumDurations(v.times).Seconds()
		b.ReportMetric(rate, v.name+"-msgs/s")
		b.ReportMetric(client, v.name+"-client-µs/msg")
		if v.spent.serverRead {
			b.ReportMetric(server, v.name+"-server-µs/msg")
		}
		b.ReportMetric(rt, v.name+"-round-trips/msg")
		b.ReportMetric(commits, v.name+"-commits/msg")
		line += fmt.Sprintf(" %s %.0f msgs/s, %s;", v.name, rate, v.spent.String(n))
	}
	b.ReportMetric(float64(wmRows), "wm-rows")
	b.ReportMetric(float64(wmBytes), "wm-bytes")
	b.Log(line + fmt.Sprintf(" watermark table %d rows, %d bytes", wmRows, wmBytes))
}

// floorHandler is the hand-written watermark, as cheap as pgx allows, in
// the watermark mode's fast path's two round trips: BEGIN and the business
// row in one, then the partition's row moved past the offset, only if it is
// still at or below it, sent with COMMIT. A guard that fails divides by
// zero, which aborts the transaction, so the COMMIT after it commits
// nothing.
func floorHandler(pool *pgxpool.Pool, watermarks, ledger string) func(context.Context, int, int64, string) error {
	insert := "INSERT INTO " + ledger + " (key, amount) VALUES ($1, 100)"
	guard := "WITH up AS (UPDATE " + watermarks + " SET next_offset = $4::int8 + 1" +
		" WHERE group_id = $1 AND topic = $2 AND partition = $3 AND next_offset <= $4::int8 RETURNING 1) SELECT 1 / count(*) FROM up"
	return func(ctx context.Context, partition int, offset int64, key string) (err error) {
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer func() {
			if err != nil && conn.Conn().PgConn().TxStatus() != 'I' {
				_, _ = conn.Exec(context.WithoutCancel(ctx), "rollback") // err says what went wrong
			}
			conn.Release()
		}()
		batch := &pgx.Batch{}
		batch.Queue("begin")
		batch.Queue(insert, key)
		if err := conn.SendBatch(ctx, batch).Close(); err != nil {
			return err
		}
		batch = &pgx.Batch{}
		batch.Queue(guard, "bench", "orders", partition, offset)
		batch.Queue("commit")
		br := conn.SendBatch(ctx, batch)
		var one int
		err = br.QueryRow().Scan(&one)
		var tag pgconn.CommandTag
		if err == nil {
			tag, err = br.Exec()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		if err == nil && tag.String() != "COMMIT" {
			err = fmt.Errorf("floor: partition %d offset %d: %s", partition, offset, tag)
		}
		return err
	}
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
