package integration

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// A Kafka consumer group makes progress again soon after its handlers'
// database comes back. Three workers consume a topic of three partitions,
// one is SIGKILLed and replaced every 1–3 s, payments keep arriving, and the
// workers reach PostgreSQL (the one-transaction mode: ledger and records)
// through a proxy that the test cuts for 4 s. During the cut every delivery
// fails and is nacked after oncemill's pause, so a member whose partitions
// were revoked rejoined the group only when its delivery finally succeeded,
// after the members that were idle; kfake drops the JoinGroup of a member
// left waiting that long (TestKfakeDropsJoinOfMemberWhoseSessionExpires),
// and the group stopped until sarama's 30 s read timeout. The example
// worker bounds the rebalance and read timeouts (internal/worker/kafka.go,
// docs/kafka.md, "A rebalance during an outage"). From the cut's end until
// every payment is charged, the ledger (read from PostgreSQL directly) must
// never go 15 s without a new charge, a liveness bound, not a speed target;
// and every payment is charged exactly once.
func TestKafkaGroupProgressesAfterDatabaseOutage(t *testing.T) {
	h := newHarness(t, brokerKinds[0], storeKinds[0]) // kafka, postgres
	proxy := faultProxy(t, pgUpstream(t))
	u, err := url.Parse(env.postgresDSN)
	must(t, err)
	u.Host = proxy.Listen
	const workers = 3
	// The later --postgres-dsn wins: the workers reach PostgreSQL through
	// the proxy; the test reads the ledger directly.
	start := func(i int) *worker {
		return h.start(fmt.Sprintf("worker-%d", i), "--kafka-partitions=3", "--postgres-dsn="+u.String())
	}
	running := make([]*worker, workers)
	for i := range running {
		running[i] = start(i)
	}

	// Payments arrive at about 40 a second from before the cut until the
	// churn ends.
	var mu sync.Mutex
	want := map[string]int{}
	stopPublishing := make(chan struct{})
	published := make(chan struct{})
	go func() {
		defer close(published)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopPublishing:
				return
			case <-tick.C:
			}
			for range 10 {
				mu.Lock()
				id := fmt.Sprintf("p-%d", len(want))
				want[id] = 1
				mu.Unlock()
				if err := h.pub.Publish(h.payments(), newCommand(t, id, 1500, "", 1)); err != nil {
					t.Errorf("publish %s: %v", id, err)
					return
				}
			}
		}
	}()
	samples := sampleLedger(t, h)

	// The churn: a worker killed every 1–3 s from the start until 12 s after
	// the cut ends; the cut comes 8 s in and lasts 4 s. A worker killed
	// during the cut is replaced when it ends (a new worker needs the
	// database to start).
	now := time.Now()
	cutAt := now.Add(8 * time.Second)
	healAt := cutAt.Add(4 * time.Second)
	churnUntil := healAt.Add(12 * time.Second)
	nextKill := now.Add(time.Second + rand.N(2*time.Second))
	cut, healed := false, false
	var pending []int
	next, kills := workers, 0
	for time.Now().Before(churnUntil) {
		wake := nextKill
		switch {
		case !cut && cutAt.Before(wake):
			wake = cutAt
		case cut && !healed && healAt.Before(wake):
			wake = healAt
		}
		time.Sleep(time.Until(wake))
		switch {
		case !cut && !time.Now().Before(cutAt):
			cut = true
			proxy.Stop() // every connection dropped, new ones refused
			t.Logf("%v: PostgreSQL cut", time.Since(now).Round(time.Millisecond))
		case cut && !healed && !time.Now().Before(healAt):
			healed = true
			healAt = time.Now()
			must(t, proxy.Start())
			t.Logf("%v: PostgreSQL back", time.Since(now).Round(time.Millisecond))
			for _, i := range pending {
				running[i] = start(next)
				next++
			}
			pending = nil
		default:
			i := rand.IntN(workers)
			nextKill = time.Now().Add(time.Second + rand.N(2*time.Second))
			if running[i] == nil {
				continue
			}
			running[i].kill()
			kills++
			if cut && !healed {
				running[i] = nil
				pending = append(pending, i)
				continue
			}
			running[i] = start(next)
			next++
		}
	}
	close(stopPublishing)
	<-published

	// Progress after the cut: the first charge after PostgreSQL came back,
	// and then no 15 s without one until every payment is charged.
	const bound = 15 * time.Second
	mu.Lock()
	defer mu.Unlock()
	eventually(t, limit, func() bool { return len(h.ledger()) == len(want) },
		func() string {
			return fmt.Sprintf("%d of %d payments charged after %d kills", len(h.ledger()), len(want), kills)
		})
	first, longest := samples.progress(healAt)
	if first > bound || longest > bound {
		t.Errorf("after PostgreSQL came back the first charge came after %v and charging stopped for up to %v (%d kills): want at most %v",
			first.Round(10*time.Millisecond), longest.Round(10*time.Millisecond), kills, bound)
	}
	assertLedger(t, h, want)
	if t.Failed() {
		return
	}
	t.Logf("%d kills, %d payments; after the cut the first charge came after %v, and the longest pause in charging was %v; every payment charged once",
		kills, len(want), first.Round(10*time.Millisecond), longest.Round(10*time.Millisecond))
}

// ledgerSample is the number of charges in the ledger at a moment.
type ledgerSample struct {
	at time.Time
	n  int
}

type ledgerSamples struct {
	mu sync.Mutex
	s  []ledgerSample
}

// sampleLedger counts the harness's charges every 100 ms, straight from
// PostgreSQL (not through any proxy), until the test ends.
func sampleLedger(t *testing.T, h *harness) *ledgerSamples {
	pool := pgPool(t)
	table := pgx.Identifier{h.ns, "oncemill_ledger"}.Sanitize()
	ls := &ledgerSamples{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			var n int
			// The table appears with the first worker; until then, none.
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table+" WHERE scope = $1", scope).Scan(&n); err == nil {
				ls.mu.Lock()
				ls.s = append(ls.s, ledgerSample{time.Now(), n})
				ls.mu.Unlock()
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return ls
}

// countAt is the last count sampled before t.
func (ls *ledgerSamples) countAt(t time.Time) int {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	n := 0
	for _, s := range ls.s {
		if s.at.After(t) {
			break
		}
		n = s.n
	}
	return n
}

// after returns the samples taken after t.
func (ls *ledgerSamples) after(t time.Time) []ledgerSample {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	var out []ledgerSample
	for _, s := range ls.s {
		if s.at.After(t) {
			out = append(out, s)
		}
	}
	return out
}

// progress returns how long after t the count first grew, and the longest
// time after t during which it did not grow, up to its last growth.
func (ls *ledgerSamples) progress(t time.Time) (first, longest time.Duration) {
	last, n := t, ls.countAt(t)
	for _, s := range ls.after(t) {
		if s.n > n {
			if last.Equal(t) {
				first = s.at.Sub(t)
			}
			longest = max(longest, s.at.Sub(last))
			last, n = s.at, s.n
		}
	}
	return first, longest
}
