package mysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/mysql"
)

// BenchmarkTransactionalVersusPlain compares the one-transaction mode with
// a plain transaction doing the same business insert, in one run, at 1, 4
// and 16 handlers. Two variants take turns in rounds of the same number of
// messages, the order swapping each round so that neither always runs
// first, each on a pool of its own warmed to the handler count, each
// writing a ledger table of its own:
//
//   - plain: BEGIN, the INSERT, COMMIT: no idempotency, the ceiling;
//   - oncemill: receiver.NewTransactional over the store, the handler doing
//     the same INSERT through mysql.TxFromContext.
//
// It reports ratio, the median over the rounds of oncemill's rate over
// plain's in that round (a slow spell of the machine that falls on a few
// rounds moves it little), and per variant <variant>-msgs/s,
// <variant>-commits/msg and <variant>-statements/msg, counted by the
// server on the variant's own connections (Com_commit and Questions of
// each session); commits/msg is oncemill's. The plain variant must come to
// one commit per message, or the benchmark fails: a check of the counter.
//
// Run it once, under the shared lock:
//
//	go test -run='^$' -bench=TransactionalVersusPlain -benchtime=1x -timeout=30m ./store/mysql
//
// With -short it runs versusRoundsShort rounds of versusRoundShort
// messages: a check that it runs, not a figure.
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
	versusRounds      = 10
	versusRound       = 1_000 // messages per variant and round
	versusRoundsShort = 2
	versusRoundShort  = 50
	versusWarmUp      = 10 // messages per handler before the first round
)

// versusVariant is one way of handling a message, with its pool and what
// its rounds took and cost.
type versusVariant struct {
	name                string
	db                  *sql.DB
	handle              func(ctx context.Context, key string) error
	times               []time.Duration
	commits, statements int64
}

func versusPlain(b *testing.B, handlers int) {
	ctx := b.Context()
	rounds, perRound := versusRounds, versusRound
	if testing.Short() {
		rounds, perRound = versusRoundsShort, versusRoundShort
	}
	dsn := testenv.MariaDBDatabase(b)
	pool := func() *sql.DB {
		db := testenv.MariaDB(b, dsn)
		db.SetMaxOpenConns(handlers)
		db.SetMaxIdleConns(handlers)
		return db
	}
	plain := &versusVariant{name: "plain", db: pool()}
	once := &versusVariant{name: "oncemill", db: pool()}
	for _, name := range []string{"plain", "oncemill"} {
		if _, err := plain.db.ExecContext(ctx, "CREATE TABLE "+name+"_ledger (`key` VARCHAR(64) PRIMARY KEY, amount INT NOT NULL)"); err != nil {
			b.Fatal(err)
		}
	}
	plain.handle = func(ctx context.Context, key string) error {
		tx, err := plain.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, "INSERT INTO plain_ledger (`key`, amount) VALUES (?, 100)", key); err != nil {
			_ = tx.Rollback()
			return err
		}
		return tx.Commit()
	}
	st := newStore(b, once.db, mysql.Options{})
	rc, err := receiver.NewTransactional(st).WithScope("versus").Build()
	if err != nil {
		b.Fatal(err)
	}
	h := rc.Middleware(func(m *message.Message) ([]*message.Message, error) {
		tx, _ := mysql.TxFromContext(m.Context())
		_, err := tx.ExecContext(m.Context(), "INSERT INTO oncemill_ledger (`key`, amount) VALUES (?, 100)", m.UUID)
		return nil, err
	})
	once.handle = func(_ context.Context, key string) error {
		_, err := h(message.NewMessage(key, []byte("pay 100")))
		return err
	}
	variants := []*versusVariant{plain, once}
	for _, v := range variants {
		versusRoundRun(b, handlers, versusWarmUp*handlers, v.handle)
	}
	for round := range rounds {
		for j := range variants {
			v := variants[(round+j)%len(variants)]
			c0, s0 := sessionCounts(b, v.db, handlers)
			v.times = append(v.times, versusRoundRun(b, handlers, perRound, v.handle))
			c1, s1 := sessionCounts(b, v.db, handlers)
			v.commits += c1 - c0
			v.statements += s1 - s0 - int64(handlers) // each session's count includes the reading SELECT
		}
	}

	n := rounds * perRound
	for _, name := range []string{"plain_ledger", "oncemill_ledger", "oncemill_records"} {
		var rows int
		if err := plain.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM "+name).Scan(&rows); err != nil {
			b.Fatal(err)
		}
		if want := n + versusWarmUp*handlers; rows != want {
			b.Fatalf("%s holds %d rows after %d messages", name, rows, want)
		}
	}
	if c := float64(plain.commits) / float64(n); c != 1 {
		b.Fatalf("the plain transaction counted %.3f commits per message, want 1: the counter is wrong", c)
	}
	ratios := make([]float64, rounds)
	for i := range ratios {
		ratios[i] = plain.times[i].Seconds() / once.times[i].Seconds()
	}
	slices.Sort(ratios)
	ratio := ratios[rounds/2]
	if rounds%2 == 0 {
		ratio = (ratios[rounds/2-1] + ratios[rounds/2]) / 2
	}
	b.ReportMetric(ratio, "ratio")
	b.ReportMetric(float64(once.commits)/float64(n), "commits/msg")
	line := fmt.Sprintf("handlers=%d: %d rounds of %d messages per variant; ratio %.3f (rounds from %.3f to %.3f);", handlers, rounds, perRound, ratio, ratios[0], ratios[rounds-1])
	for _, v := range variants {
		var took time.Duration
		for _, d := range v.times {
			took += d
		}
		rate := float64(n) / took.Seconds()
		b.ReportMetric(rate, v.name+"-msgs/s")
		b.ReportMetric(float64(v.commits)/float64(n), v.name+"-commits/msg")
		b.ReportMetric(float64(v.statements)/float64(n), v.name+"-statements/msg")
		line += fmt.Sprintf(" %s %.0f msgs/s, %.2f commits and %.2f statements per message;", v.name, rate,
			float64(v.commits)/float64(n), float64(v.statements)/float64(n))
	}
	b.Log(line)
}

// sessionCounts sums Com_commit and Questions over the pool's handlers
// sessions, all of them at once (each held while read), so that the
// counts are the variant's own.
func sessionCounts(b *testing.B, db *sql.DB, handlers int) (commits, statements int64) {
	ctx := b.Context()
	conns := make([]*sql.Conn, handlers)
	for i := range conns {
		c, err := db.Conn(ctx)
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		var cm, q int64
		if err := c.QueryRowContext(ctx, `SELECT
			SUM(IF(VARIABLE_NAME = 'COM_COMMIT', VARIABLE_VALUE, 0)), SUM(IF(VARIABLE_NAME = 'QUESTIONS', VARIABLE_VALUE, 0))
			FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME IN ('COM_COMMIT', 'QUESTIONS')`).Scan(&cm, &q); err != nil {
			b.Fatal(err)
		}
		commits, statements = commits+cm, statements+q
	}
	for _, c := range conns {
		_ = c.Close()
	}
	return commits, statements
}

// versusRoundRun runs one round of n messages of a variant over handlers
// goroutines, each message with a fresh random key, and returns how long
// they took.
func versusRoundRun(b *testing.B, handlers, n int, handle func(context.Context, string) error) time.Duration {
	ctx := b.Context()
	keys := make([]string, n)
	for i := range keys {
		var r [16]byte
		_, _ = rand.Read(r[:])
		keys[i] = hex.EncodeToString(r[:])
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
