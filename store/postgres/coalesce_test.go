package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/storetest"
)

// statementCounter is a pgx tracer that counts the store's Begin and
// Complete statements: each is one round trip.
type statementCounter struct {
	begins, completes atomic.Int64
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	switch {
	case strings.Contains(d.SQL, "ON CONFLICT (scope, key)"):
		c.begins.Add(1)
	case strings.Contains(d.SQL, "RETURNING req.ord"):
		c.completes.Add(1)
	}
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func countingPool(t *testing.T, maxConns int32) (*pgxpool.Pool, *statementCounter) {
	counter := &statementCounter{}
	pool := newPool(t, func(c *pgxpool.Config) {
		c.ConnConfig.Tracer = counter
		if maxConns > 0 {
			c.MaxConns = maxConns
		}
	})
	return pool, counter
}

// waitFor polls cond until it holds, failing the test after a generous
// bound (a hang guard, not a speed assertion).
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// blocker holds a row lock in an open transaction, so that the store's
// single batch worker of one kind blocks on it while requests queue up
// behind it. release lets the worker go.
type blocker struct {
	release func()
	done    chan error
}

// blockBegins makes the store's (single) Begin worker wait.
func blockBegins(t *testing.T, s *postgres.Store, pool *pgxpool.Pool, schema string) *blocker {
	t.Helper()
	ctx := t.Context()
	if _, err := s.Begin(ctx, store.BeginRequest{Scope: "blocker", Key: "b", Lease: time.Hour}); err != nil {
		t.Fatal(err)
	}
	tx := lockRow(t, pool, schema, "blocker", "b")
	b := &blocker{done: make(chan error, 1)}
	go func() {
		_, err := s.Begin(ctx, store.BeginRequest{Scope: "blocker", Key: "b", Lease: time.Hour})
		b.done <- err
	}()
	waitForLockWait(t, pool, schema)
	b.release = func() { tx.Rollback(context.Background()) } //nolint:errcheck
	return b
}

// lockRow locks one record in an open transaction.
func lockRow(t *testing.T, pool *pgxpool.Pool, schema, scope, key string) pgx.Tx {
	t.Helper()
	tx, err := pool.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck
	if _, err := tx.Exec(t.Context(), "SELECT 1 FROM "+table(schema, "")+" WHERE scope = $1 AND key = $2 FOR UPDATE", scope, key); err != nil {
		t.Fatal(err)
	}
	return tx
}

// waitForLockWait waits until a statement on the schema waits for a lock.
func waitForLockWait(t *testing.T, pool *pgxpool.Pool, schema string) {
	t.Helper()
	waitFor(t, "the batch worker to wait for the row lock", func() bool {
		var n int
		err := pool.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND position($1 in query) > 0`, schema).Scan(&n)
		return err == nil && n > 0
	})
}

type beginOutcome struct {
	res store.BeginResult
	err error
}

// enqueueBegins starts one Begin per request, each only after the previous
// one is queued, so their order in the queue is the order given.
func enqueueBegins(t *testing.T, s *postgres.Store, reqs []store.BeginRequest) []chan beginOutcome {
	t.Helper()
	out := make([]chan beginOutcome, len(reqs))
	base := s.BeginQueueLen()
	for i, r := range reqs {
		out[i] = make(chan beginOutcome, 1)
		go func() {
			res, err := s.Begin(t.Context(), r)
			out[i] <- beginOutcome{res, err}
		}()
		waitFor(t, fmt.Sprintf("Begin %d to be queued", i), func() bool { return s.BeginQueueLen() == base+i+1 })
	}
	return out
}

// Requests that queue while a statement runs all go out in the next one:
// one round trip for all of them.
func TestCoalescingOneStatementForWaitingBegins(t *testing.T) {
	pool, counter := countingPool(t, 0)
	schema := newSchema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema, BatchWorkers: 1})
	b := blockBegins(t, s, pool, schema)

	const n = 31
	reqs := make([]store.BeginRequest, n)
	for i := range reqs {
		reqs[i] = store.BeginRequest{Scope: "s", Key: fmt.Sprintf("k-%d", i), Fingerprint: "fp", Lease: time.Minute}
	}
	outs := enqueueBegins(t, s, reqs)
	before := counter.begins.Load()
	b.release()
	if err := <-b.done; err != nil {
		t.Fatal(err)
	}
	for i, ch := range outs {
		o := <-ch
		if o.err != nil || o.res.Decision != store.Execute {
			t.Fatalf("Begin %d = %v, %v; want execute", i, o.res.Decision, o.err)
		}
		if o.res.Lease.Key != reqs[i].Key || o.res.Lease.Attempt != 1 {
			t.Fatalf("Begin %d got the lease of %q attempt %d", i, o.res.Lease.Key, o.res.Lease.Attempt)
		}
	}
	// The blocked statement finishes, then one statement carries all 31.
	if got := counter.begins.Load() - before; got != 1 {
		t.Fatalf("%d Begin statements for %d queued Begins, want 1", got, n)
	}
}

// Under free-running load (32 goroutines, no blocking), statements carry
// several requests each: fewer round trips than Begins.
func TestCoalescingUnderLoad(t *testing.T) {
	pool, counter := countingPool(t, 4)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	s := newStore(t, pool, postgres.Options{MeterProvider: mp, BatchWorkers: 2})
	ctx := t.Context()

	const goroutines, perGoroutine = 32, 20
	var wg sync.WaitGroup
	start := make(chan struct{})
	var failed atomic.Bool
	for g := range goroutines {
		wg.Go(func() {
			<-start
			for i := range perGoroutine {
				res, err := s.Begin(ctx, store.BeginRequest{Scope: "load", Key: fmt.Sprintf("%d-%d", g, i), Lease: time.Minute})
				if err != nil || res.Decision != store.Execute {
					t.Errorf("Begin = %v, %v", res.Decision, err)
					failed.Store(true)
					return
				}
				if err := s.Complete(ctx, res.Lease, store.Outcome{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
					t.Errorf("Complete: %v", err)
					failed.Store(true)
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	if failed.Load() {
		t.FailNow()
	}
	const total = goroutines * perGoroutine
	begins, completes := counter.begins.Load(), counter.completes.Load()
	t.Logf("%d messages: %d Begin statements (%.1f per statement), %d Complete statements (%.1f per statement)",
		total, begins, float64(total)/float64(begins), completes, float64(total)/float64(completes))
	if begins >= total || completes >= total {
		t.Fatalf("no coalescing: %d Begin and %d Complete statements for %d messages", begins, completes, total)
	}

	// The batch size histogram shows it too.
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	var maxBatch int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != postgres.MetricBatchSize {
				continue
			}
			for _, dp := range m.Data.(metricdata.Histogram[int64]).DataPoints {
				if v, ok := dp.Max.Value(); ok && v > maxBatch {
					maxBatch = v
				}
			}
		}
	}
	if maxBatch < 2 {
		t.Fatalf("largest batch in %s = %d, want several requests", postgres.MetricBatchSize, maxBatch)
	}
}

// One batch carrying the same key several times answers each request as if
// they had arrived one after another, in queue order.
func TestCoalescingSameKeyTwiceInOneBatch(t *testing.T) {
	pool, counter := countingPool(t, 0)
	schema := newSchema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema, BatchWorkers: 1})
	b := blockBegins(t, s, pool, schema)

	req := func(key, fp string) store.BeginRequest {
		return store.BeginRequest{Scope: "dup", Key: key, Fingerprint: fp, Lease: time.Minute}
	}
	outs := enqueueBegins(t, s, []store.BeginRequest{
		req("k", "a"),  // 0: executes
		req("k", "a"),  // 1: in progress (0 holds it)
		req("k2", ""),  // 2: executes, in the first statement with 0
		req("k", "b"),  // 3: mismatch
		req("k", ""),   // 4: in progress
		req("k2", "x"), // 5: in progress (empty stored fingerprint is never checked)
	})
	before := counter.begins.Load()
	b.release()
	if err := <-b.done; err != nil {
		t.Fatal(err)
	}
	want := []store.Decision{store.Execute, store.InProgress, store.Execute, store.Mismatch, store.InProgress, store.InProgress}
	results := make([]store.BeginResult, len(outs))
	for i, ch := range outs {
		o := <-ch
		if o.err != nil {
			t.Fatalf("Begin %d: %v", i, o.err)
		}
		results[i] = o.res
		if o.res.Decision != want[i] {
			t.Errorf("Begin %d = %v, want %v", i, o.res.Decision, want[i])
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	if got := results[1].Record.Token; got != results[0].Lease.Token {
		t.Errorf("in-progress duplicate sees token %d, want the holder's %d", got, results[0].Lease.Token)
	}
	// Rounds: {k#0, k2#2}, {k#1, k2#5}, {k#3}, {k#4}.
	if got := counter.begins.Load() - before; got != 4 {
		t.Errorf("%d statements for the batch, want 4 rounds", got)
	}

	// Two Completes of one lease in one batch: the first wins, the second
	// finds the lease finished.
	cres, err := s.Begin(t.Context(), store.BeginRequest{Scope: "blocker", Key: "c2", Lease: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	tx := lockRow(t, pool, schema, "blocker", "c2")
	blocked := make(chan error, 1)
	go func() {
		blocked <- s.Complete(t.Context(), cres.Lease, store.Outcome{Status: store.StatusSucceeded, TTL: time.Hour})
	}()
	waitForLockWait(t, pool, schema)
	lease := results[0].Lease
	errs := make([]chan error, 3)
	outcomes := []store.Outcome{
		{Status: store.StatusSucceeded, Result: []byte("first"), TTL: time.Hour},
		{Status: store.StatusSucceeded, Result: []byte("second"), TTL: time.Hour},
		{Status: store.StatusSucceeded, Result: []byte("k2"), TTL: time.Hour},
	}
	leases := []store.Lease{lease, lease, results[2].Lease}
	base := s.CompleteQueueLen()
	for i := range errs {
		errs[i] = make(chan error, 1)
		go func() { errs[i] <- s.Complete(t.Context(), leases[i], outcomes[i]) }()
		waitFor(t, "Complete to be queued", func() bool { return s.CompleteQueueLen() == base+i+1 })
	}
	tx.Rollback(context.Background()) //nolint:errcheck
	if err := <-blocked; err != nil {
		t.Fatal(err)
	}
	if err := <-errs[0]; err != nil {
		t.Fatalf("first Complete: %v", err)
	}
	if err := <-errs[1]; !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second Complete of the same lease = %v, want ErrLeaseLost", err)
	}
	if err := <-errs[2]; err != nil {
		t.Fatalf("Complete of k2: %v", err)
	}
	rec, err := s.Get(t.Context(), "dup", "k")
	if err != nil || string(rec.Result) != "first" {
		t.Fatalf("record = %q, %v; want the first Complete's result", rec.Result, err)
	}
}

// Issue requirement: 32 goroutines over a pool of 4 connections, 30% of the
// deliveries duplicates, each Begin→Complete: exactly one Execute per key.
func TestConcurrency32GoroutinesOver4Connections(t *testing.T) {
	pool, _ := countingPool(t, 4)
	schema := newSchema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema})
	ctx := t.Context()
	const keys = 1000
	storetest.ExecuteOnce(t, s, "conc", keys)
	var succeeded int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table(schema, "")+" WHERE scope = 'conc' AND status = 2").Scan(&succeeded); err != nil {
		t.Fatal(err)
	}
	if succeeded != keys {
		t.Fatalf("%d succeeded records, want %d", succeeded, keys)
	}
}
