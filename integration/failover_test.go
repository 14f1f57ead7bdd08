package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/integration/internal/pgpair"
)

// TestPostgresFailover kills a PostgreSQL primary under three workers
// of the rig in the one-transaction mode (and, on Kafka, the watermark
// mode; and the tiered store, its local and Redis caches in front of the
// one-transaction mode, with the synchronous standby) over a PostgreSQL
// primary with a streaming standby of its own (internal/pgpair) that gets
// the WAL failoverReplicationLatency late, the ledger in the same
// database. The workers connect through the multi-host connection string
// with target_session_attrs=read-write. In the middle of 3,000 messages,
// 30% of them duplicates, the WAL on its way is cut, the primary killed
// (pg_ctl -m immediate) and the standby promoted failoverPromoteAfter
// later; the workers must reach it without a restart, within
// failoverResume of the kill, and nothing may be cached
// or dead-lettered.
//
// With a synchronous standby nothing acked is lost: every payment is
// charged as often as it must be (once in the one-transaction mode; in the
// watermark mode, whose key is the offset, once per message published).
// With an asynchronous standby a commit acked before the kill can be
// missing on the new primary, and its message is not delivered again: the
// test logs those counts and the replay lag at the kill.
func TestPostgresFailover(t *testing.T) {
	t.Parallel()
	for _, sync := range []bool{true, false} {
		for _, c := range []struct{ mode, broker string }{{"one-transaction", "kafka"}, {"one-transaction", "amqp-v3"}, {"watermark", "kafka"}, {"tiered", "kafka"}, {"tiered", "amqp-v3"}} {
			if c.mode == "tiered" && !sync {
				continue // its truth is the one-transaction mode's: the async losses are those
			}
			repl := map[bool]string{true: "sync", false: "async"}[sync]
			// One run at a time: each is two servers and three workers,
			// beside the rest of the suite.
			t.Run(repl+"/"+c.mode+"/"+c.broker, func(t *testing.T) {
				r := runFailover(t, brokerKindNamed(t, c.broker), c.mode, sync)
				t.Logf("%s standby, %s mode, %s: %s", repl, c.mode, c.broker, r)
				// A failover is a store failure: never cached, never dead-lettered.
				if r.dead > 0 || r.outcomes["cached_failure"] > 0 {
					t.Errorf("%d dead letters, %d cached failures; want none", r.dead, r.outcomes["cached_failure"])
				}
				if sync && (r.lost > 0 || r.doubled > 0) {
					t.Errorf("with a synchronous standby: %d payments lost, %d doubled; want none", r.lost, r.doubled)
				}
			})
		}
	}
}

const (
	failoverMessages = 3000
	failoverDupShare = 0.3
	failoverWorkers  = 3
	// failoverResume bounds the time from the kill to the first message
	// processed on the new primary, a Redis one included.
	failoverResume = 30 * time.Second
	// failoverPromoteAfter is how long after the kill the standby is
	// promoted: the time a failover manager takes to decide, shortened.
	failoverPromoteAfter = 2 * time.Second
	// failoverReplicationLatency delays the WAL to the standby, as a
	// network between them would; the kill cuts what is on its way.
	failoverReplicationLatency = 5 * time.Millisecond
	// failoverQuiet ends a run whose ledger stopped growing short of what
	// was published (an asynchronous standby's losses).
	failoverQuiet = 5 * time.Second
)

// failoverRun is what one run counted.
type failoverRun struct {
	lost, doubled, dead int
	charged             int // ledger rows
	atKill              int // ledger rows on the primary just before the kill
	lag                 pgpair.Lag
	resume              time.Duration // kill to the first row the new primary took
	outcomes            map[string]int
}

func (r failoverRun) String() string {
	return fmt.Sprintf("lost %d, doubled %d, dead-lettered %d; %d ledger rows, %d at the kill; replay lag at the kill %d bytes (%v), WAL not received %d bytes; first message processed on the new primary %v after the kill; outcomes %v",
		r.lost, r.doubled, r.dead, r.charged, r.atKill, r.lag.ReplayBytes, r.lag.ReplayLag, r.lag.MissingBytes, r.resume.Round(time.Millisecond), r.outcomes)
}

// pairStore is the one-transaction store kind over a pair: the records
// and the ledger in the database the multi-host string reaches; with
// tiered, behind the tiered store's caches, in the machine's Redis.
func pairStore(t *testing.T, p *pgpair.Pair, pool func() *pgxpool.Pool, tiered bool) storeKind {
	pg := storeKindNamed(t, "postgres")
	cleanup := func(*testing.T, string) {} // the pair goes with its directory
	if tiered {
		cleanup = storeKindNamed(t, "redis").cleanup
	}
	return storeKind{
		name: "postgres-pair",
		workerArgs: func(ns string) []string {
			if tiered {
				return []string{"--store=tiered", "--postgres-dsn=" + p.DSN(), "--postgres-schema=" + ns, "--redis-addr=" + env.redisAddr, "--redis-prefix=" + ns}
			}
			return []string{"--store=postgres", "--postgres-dsn=" + p.DSN(), "--postgres-schema=" + ns}
		},
		ledger: func(t *testing.T, ns, scope string) map[string]int {
			return ledgerCounts(t, pool(), ns, scope)
		},
		cleanup: cleanup,
		layout:  pg.layout,
	}
}

// ledgerCounts is the charges per payment_id in ns's ledger table.
func ledgerCounts(t *testing.T, pool *pgxpool.Pool, ns, scope string) map[string]int {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		"SELECT payment_id, count(*) FROM "+pgx.Identifier{ns, "oncemill_ledger"}.Sanitize()+" WHERE scope = $1 GROUP BY payment_id", scope)
	if err != nil {
		t.Fatalf("reading the ledger table: %v", err)
	}
	out := map[string]int{}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error { out[id] = n; return nil })
	if err != nil {
		t.Fatalf("reading the ledger table: %v", err)
	}
	return out
}

// runFailover runs mode (one-transaction, watermark or tiered) through a
// failover of a sync or async pair.
func runFailover(t *testing.T, bk brokerKind, mode string, sync bool) failoverRun {
	watermark := mode == "watermark"
	p := pgpair.Start(t, pgpair.Options{Sync: sync, Latency: failoverReplicationLatency})
	// Reads of the ledger go to one server at a time: the primary until
	// the kill, then the promoted standby.
	var current atomic.Pointer[pgxpool.Pool]
	openPool := func(dsn string) *pgxpool.Pool {
		pool, err := pgxpool.New(context.Background(), dsn)
		must(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	current.Store(openPool(p.PrimaryDSN(pgpair.Database)))
	h := newHarness(t, bk, pairStore(t, p, current.Load, mode == "tiered"))
	table := pgx.Identifier{h.ns, "oncemill_ledger"}.Sanitize()
	rowsOn := func(pool *pgxpool.Pool) (int, error) {
		var n int
		err := pool.QueryRow(context.Background(), "SELECT count(*) FROM "+table).Scan(&n)
		return n, err
	}

	var args []string
	if watermark {
		args = append(args, "--kafka-watermark")
	}
	workers := startFailoverWorkers(t, h, args...)
	dead := h.observe(h.deadLetters())

	// The messages: unique payments and duplicates of them, shuffled. A
	// duplicate is the same message again (a redelivery) or the same
	// command under a new UUID (a client's retry); the watermark mode keys
	// by offset, so there it only republishes the message, which is
	// charged again.
	dups := int(failoverMessages * failoverDupShare)
	unique := failoverMessages - dups
	want := map[string]int{}
	msgs := make([]*message.Message, 0, failoverMessages)
	for i := range unique {
		id := fmt.Sprintf("p-%d", i)
		msgs = append(msgs, newCommand(t, id, 1500, "", 1))
		want[id] = 1
	}
	for i := range dups {
		orig := msgs[rand.IntN(unique)]
		var c command
		must(t, json.Unmarshal(orig.Payload, &c))
		if watermark || i%2 == 0 {
			msgs = append(msgs, again(orig))
		} else {
			msgs = append(msgs, newCommand(t, c.PaymentID, c.AmountCents, "", 2))
		}
		if watermark {
			want[c.PaymentID]++
		}
	}
	rand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	wantRows := 0
	for _, n := range want {
		wantRows += n
	}
	published := make(chan struct{})
	go func() {
		defer close(published)
		for i, m := range msgs {
			if err := h.pub.Publish(h.payments(), m); err != nil {
				t.Errorf("publishing message %d: %v", i, err)
				return
			}
		}
	}()

	// The kill, when half the rows are in, and the promotion at once.
	var r failoverRun
	eventually(t, 3*limit, func() bool {
		n, err := rowsOn(current.Load())
		return err == nil && n >= wantRows/2
	}, func() string {
		n, err := rowsOn(current.Load())
		return fmt.Sprintf("%d of %d ledger rows (%v)", n, wantRows, err)
	})
	r.atKill, _ = rowsOn(current.Load())
	killed := time.Now()
	r.lag = p.KillPrimary()
	// The workers meanwhile find no server that takes writes: the old
	// primary refuses connections, the standby is read-only.
	time.Sleep(failoverPromoteAfter)
	p.Promote()
	current.Store(openPool(p.StandbyDSN(pgpair.Database)))
	promotedRows, err := rowsOn(current.Load())
	must(t, err)
	for {
		n, err := rowsOn(current.Load())
		if err == nil && n > promotedRows {
			r.resume = time.Since(killed)
			break
		}
		if time.Since(killed) > failoverResume {
			t.Fatalf("no message processed on the new primary %v after the kill (%d ledger rows at the promotion, %d now); outcomes %v",
				failoverResume, promotedRows, n, outcomes(workers...))
		}
		time.Sleep(20 * time.Millisecond)
	}

	// The rest: until every row is in, or the ledger stays still after
	// the last message was published.
	<-published
	last, lastChange := -1, time.Now()
	deadline := time.Now().Add(3 * limit)
	for {
		n, err := rowsOn(current.Load())
		must(t, err)
		if n >= wantRows {
			break
		}
		if n != last {
			last, lastChange = n, time.Now()
		}
		if time.Since(lastChange) > failoverQuiet || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(time.Second) // a dead letter or a late double on its way
	for _, w := range workers {
		select {
		case <-w.exited:
			t.Errorf("%s exited (%v) during the failover; it must ride it out; log:\n%s", w.name, w.waitErr, w.tailLog(20))
		default:
		}
	}
	r.outcomes = outcomes(workers...)

	got := h.ledger()
	var lost, doubled []string
	for id, n := range want {
		r.charged += got[id]
		switch {
		case got[id] < n:
			lost = append(lost, id)
		case got[id] > n:
			doubled = append(doubled, id)
		}
	}
	r.lost, r.doubled, r.dead = len(lost), len(doubled), len(dead.received())
	if len(lost) > 0 {
		t.Logf("lost, e.g.: %s", strings.Join(lost[:min(5, len(lost))], ", "))
	}
	if len(doubled) > 0 {
		t.Logf("doubled, e.g.: %s", strings.Join(doubled[:min(5, len(doubled))], ", "))
	}
	for _, w := range workers {
		w.kill()
	}
	return r
}
