package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// fill creates n succeeded records with the given TTL in scope.
func fill(t *testing.T, s *postgres.Store, scope string, n int, ttl time.Duration) {
	t.Helper()
	for i := range n {
		res, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: scope, Key: fmt.Sprint(i), LeaseDuration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(t.Context(), res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBackgroundCleaner(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	seed := newStore(t, pool, postgres.Options{Schema: schema})
	fill(t, seed, "short", 25, time.Minute)
	fill(t, seed, "long", 5, 24*time.Hour)
	advance(t, pool, table(schema, ""), 2*time.Minute)

	// Batches of 10: the pass loops until nothing expired is left.
	s := newStore(t, pool, postgres.Options{Schema: schema, CleanupInterval: 20 * time.Millisecond, CleanupBatch: 10})
	rows := func() (n int) {
		if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table(schema, "")).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	testenv.WaitFor(t, 30*time.Second, "the background cleaner to remove the expired rows", func() bool { return rows() == 5 })
	if _, err := s.Get(t.Context(), "long", "0"); err != nil {
		t.Fatalf("a live record was removed: %v", err)
	}
	if err := s.Close(); err != nil { // stops the cleaner and waits for it
		t.Fatal(err)
	}
}

// One cleaner at a time across workers: while another session holds the
// cleaner's advisory lock, a pass does nothing.
func TestOneCleanerAtATime(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema, CleanupBatch: 7})
	fill(t, s, "x", 20, time.Minute)
	advance(t, pool, table(schema, ""), 2*time.Minute)

	other, err := pool.Acquire(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer other.Release()
	var got bool
	if err := other.QueryRow(t.Context(), "SELECT pg_try_advisory_lock($1)", s.CleanupLockKey()).Scan(&got); err != nil || !got {
		t.Fatalf("taking the cleaner lock as another worker: %v %v", got, err)
	}
	removed, ran, err := s.CleanupPass(t.Context())
	if err != nil || ran || removed != 0 {
		t.Fatalf("CleanupPass while another worker cleans = %d, %v, %v; want 0, false, nil", removed, ran, err)
	}
	if _, err := other.Exec(t.Context(), "SELECT pg_advisory_unlock($1)", s.CleanupLockKey()); err != nil {
		t.Fatal(err)
	}
	removed, ran, err = s.CleanupPass(t.Context())
	if err != nil || !ran || removed != 20 {
		t.Fatalf("CleanupPass = %d, %v, %v; want 20, true, nil", removed, ran, err)
	}
	// The pass let go of the lock.
	if err := other.QueryRow(t.Context(), "SELECT pg_try_advisory_lock($1)", s.CleanupLockKey()).Scan(&got); err != nil || !got {
		t.Fatalf("the cleaner lock is still held after the pass: %v %v", got, err)
	}
	other.Exec(t.Context(), "SELECT pg_advisory_unlock($1)", s.CleanupLockKey()) //nolint:errcheck
}

// Cleanup skips rows another transaction holds instead of waiting for them:
// it never queues behind a ClaimLease.
func TestDeleteExpiredSkipsLockedRows(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema})
	fill(t, s, "x", 10, time.Minute)
	advance(t, pool, table(schema, ""), 2*time.Minute)
	lockRow(t, pool, schema, "x", "3") // as a ClaimLease taking the key over would

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second) // hang guard
	defer cancel()
	n, err := s.DeleteExpired(ctx, 100)
	if err != nil || n != 9 {
		t.Fatalf("DeleteExpired with one row locked = %d, %v; want 9 removed without waiting", n, err)
	}
}

func TestCleanupLagMetric(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	k := teltest.New(t)
	s := newStore(t, pool, postgres.Options{Schema: schema, MeterProvider: k.MeterProvider})
	ctx := t.Context()

	observe := func() (lag float64, deleted int64) {
		t.Helper()
		ms := k.Metrics(t)
		lag = -1
		for _, v := range teltest.Gauge[float64](t, ms, "oncemill.store.cleanup.lag", "") {
			lag = v
		}
		return lag, teltest.Sums(t, ms, "oncemill.store.cleanup.deleted", "")[""]
	}

	if lag, _ := observe(); lag != 0 {
		t.Fatalf("lag with an empty table = %v, want 0", lag)
	}
	fill(t, s, "x", 3, time.Minute)
	advance(t, pool, table(schema, ""), time.Hour)
	lag, _ := observe()
	if lag < 59*60-5 || lag > 59*60+60 {
		t.Fatalf("lag after the records expired 59 minutes ago = %.0fs, want about 3540s", lag)
	}
	if removed, _, err := s.CleanupPass(ctx); err != nil || removed != 3 {
		t.Fatalf("CleanupPass = %d, %v", removed, err)
	}
	lag, deleted := observe()
	if lag != 0 || deleted != 3 {
		t.Fatalf("after cleanup: lag %v, deleted %d; want 0 and 3", lag, deleted)
	}
	if d, err := s.CleanupLag(ctx); err != nil || d != 0 {
		t.Fatalf("CleanupLag = %v, %v", d, err)
	}
}
