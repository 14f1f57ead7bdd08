package postgres_test

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// ageLease moves the row of key into the partition "aged" (made for the
// purpose, hours back, by the first call), as if it had been claimed
// there: no write on it may then change it in place (partFresh).
func ageLease(t *testing.T, pool *pgxpool.Pool, schema, key string) {
	t.Helper()
	lower := dbNow(t, pool).Truncate(time.Hour).Add(-3 * time.Hour)
	if len(texts(t, pool, "SELECT to_regclass($1)::text WHERE to_regclass($1) IS NOT NULL", schema+".aged")) == 0 {
		addPartition(t, pool, schema, "aged", lower, lower.Add(time.Hour))
	}
	run(t, pool, "UPDATE "+table(schema, partitionedTable)+" SET claimed_at = $2 WHERE key = $1", key, lower.Add(time.Minute))
	if rows := rowsOf(t, pool, schema, "s", key); len(rows) != 1 || !strings.HasSuffix(rows[0], "aged") {
		t.Fatalf("the aged lease's rows are in %v; want one, in aged", rows)
	}
}

// claimedAt is the claimed_at of key's row, by the server's clock.
func claimedAt(t *testing.T, pool *pgxpool.Pool, schema, key string) time.Time {
	t.Helper()
	var at time.Time
	if err := pool.QueryRow(t.Context(), "SELECT claimed_at FROM "+table(schema, partitionedTable)+" WHERE key = $1", key).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

// Complete, Release and Extend of a lease claimed filterDelay ago or more
// move its row to the partition of now, with the outcome written and the
// token, attempt and creation time kept: Get, a replay, a retry and a
// second Complete find the record as an update in place leaves it. A
// lease claimed just now is written in place, in one statement.
func TestPartitionedLeaseWritesMoveAnAgedRow(t *testing.T) {
	t.Parallel()
	count, pool, schema, s := newCountedPartitioned(t)
	ctx := t.Context()
	lease := func(key string) store.Claim {
		t.Helper()
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: key, Fingerprint: "f", LeaseDuration: time.Minute, Retain: time.Hour})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimLease(%s) = %+v, %v; want Execute", key, res, err)
		}
		return res.Claim
	}
	moved := func(key string, before time.Time) {
		t.Helper()
		if rows := rowsOf(t, pool, schema, "s", key); len(rows) != 1 || strings.HasSuffix(rows[0], "aged") {
			t.Fatalf("%s's rows are in %v; want one, moved out of aged", key, rows)
		}
		if at := claimedAt(t, pool, schema, key); !at.After(before) {
			t.Fatalf("%s's claimed_at is %v; want the move's, after %v", key, at, before)
		}
	}

	t.Run("fresh lease in place", func(t *testing.T) {
		l := lease("fresh")
		at := claimedAt(t, pool, schema, "fresh")
		before := count.load()
		if err := s.Complete(ctx, l, store.Completion{Status: store.StatusSucceeded, Result: []byte("r"), TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		if n := count.load().minus(before); n.statements != 1 {
			t.Fatalf("Complete of a fresh lease sent %v statements; want 1", n.statements)
		}
		if got := claimedAt(t, pool, schema, "fresh"); !got.Equal(at) {
			t.Fatalf("claimed_at went from %v to %v; want the row updated in place", at, got)
		}
	})

	t.Run("complete", func(t *testing.T) {
		l := lease("done")
		ageLease(t, pool, schema, "done")
		now := dbNow(t, pool)
		before := count.load()
		if err := s.Complete(ctx, l, store.Completion{Status: store.StatusSucceeded, Result: []byte("result"), TTL: time.Hour}); err != nil {
			t.Fatalf("Complete of an aged lease: %v", err)
		}
		if n := count.load().minus(before); n.statements != 2 {
			t.Fatalf("Complete of an aged lease sent %v statements; want 2 (in place, then the move)", n.statements)
		}
		moved("done", now)
		rec, err := s.Get(ctx, "s", "done")
		if err != nil || rec.Status != store.StatusSucceeded || string(rec.Result) != "result" || rec.Token != l.Token || rec.Attempt != 1 || rec.Fingerprint != "f" {
			t.Fatalf("Get = %+v, %v; want the success of token %d at attempt 1", rec, err, l.Token)
		}
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "done", Fingerprint: "f", LeaseDuration: time.Minute, Retain: time.Hour})
		if err != nil || res.Decision != store.DecisionReplay || string(res.Record.Result) != "result" {
			t.Fatalf("ClaimLease after the move = %+v, %v; want the result replayed", res, err)
		}
		if err := s.Complete(ctx, l, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("a second Complete of the finished lease = %v; want ErrLeaseLost", err)
		}
	})

	t.Run("release", func(t *testing.T) {
		l := lease("retry")
		ageLease(t, pool, schema, "retry")
		now := dbNow(t, pool)
		if err := s.Release(ctx, l, store.Completion{Status: store.StatusRetryable, TTL: time.Hour, Uncounted: true}); err != nil {
			t.Fatalf("Release of an aged lease: %v", err)
		}
		moved("retry", now)
		rec, err := s.Get(ctx, "s", "retry")
		if err != nil || rec.Status != store.StatusRetryable || rec.Token != l.Token || rec.Attempt != 0 {
			t.Fatalf("Get = %+v, %v; want retryable, token %d, the uncounted attempt given back", rec, err, l.Token)
		}
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "retry", Fingerprint: "f", LeaseDuration: time.Minute, Retain: time.Hour})
		if err != nil || res.Decision != store.DecisionExecute || res.Claim.Attempt != 1 || res.Claim.Token <= l.Token {
			t.Fatalf("ClaimLease after the release = %+v, %v; want Execute at attempt 1 with a token above %d", res, err, l.Token)
		}
	})

	t.Run("release held back", func(t *testing.T) {
		l := lease("paused")
		ageLease(t, pool, schema, "paused")
		if err := s.Release(ctx, l, store.Completion{Status: store.StatusRetryable, TTL: time.Hour, RetryAfter: time.Hour}); err != nil {
			t.Fatalf("Release of an aged lease: %v", err)
		}
		moved("paused", time.Time{})
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "paused", Fingerprint: "f", LeaseDuration: time.Minute, Retain: time.Hour})
		if err != nil || res.Decision != store.DecisionHeld || res.RetryIn <= 59*time.Minute {
			t.Fatalf("ClaimLease after a release held back for an hour = %+v, %v; want Held for about an hour", res, err)
		}
	})

	t.Run("extend", func(t *testing.T) {
		l := lease("long")
		ageLease(t, pool, schema, "long")
		now := dbNow(t, pool)
		ext, err := s.Extend(ctx, l, 2*time.Hour)
		if err != nil || ext.Attempt != 1 || ext.ExpiresAt.Before(now.Add(119*time.Minute)) {
			t.Fatalf("Extend of an aged lease = %+v, %v; want attempt 1, expiring in about two hours", ext, err)
		}
		moved("long", now)
		at := claimedAt(t, pool, schema, "long")
		// The moved row is fresh: the Complete that follows is in place.
		if err := s.Complete(ctx, ext, store.Completion{Status: store.StatusSucceeded, Result: []byte("late"), TTL: time.Hour}); err != nil {
			t.Fatalf("Complete after the Extend: %v", err)
		}
		if got := claimedAt(t, pool, schema, "long"); !got.Equal(at) {
			t.Fatalf("claimed_at went from %v to %v; want the freshly moved row completed in place", at, got)
		}
		if rec, err := s.Get(ctx, "s", "long"); err != nil || rec.Status != store.StatusSucceeded || string(rec.Result) != "late" || rec.Token != l.Token {
			t.Fatalf("Get = %+v, %v; want the success of token %d", rec, err, l.Token)
		}
	})

	t.Run("lost", func(t *testing.T) {
		l := lease("lost")
		ageLease(t, pool, schema, "lost")
		stale := l
		stale.Token++
		if err := s.Complete(ctx, stale, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Complete with another token = %v; want ErrLeaseLost", err)
		}
		if _, err := s.Extend(ctx, stale, time.Hour); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Extend with another token = %v; want ErrLeaseLost", err)
		}
		if err := s.Release(ctx, stale, store.Completion{Status: store.StatusRetryable, TTL: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Release with another token = %v; want ErrLeaseLost", err)
		}
		if rows := rowsOf(t, pool, schema, "s", "lost"); len(rows) != 1 || !strings.HasSuffix(rows[0], "aged") {
			t.Fatalf("the lease's rows are in %v; want it left in aged", rows)
		}
		// Past its purge time and expired, the row may go with its
		// partition: Complete and Release refuse it (partLive).
		run(t, pool, "UPDATE "+table(schema, partitionedTable)+" SET expires_at = now() - interval '1 second', purge_at = now() - interval '1 second' WHERE key = 'lost'")
		if err := s.Complete(ctx, l, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Complete of a lease past its purge time = %v; want ErrLeaseLost", err)
		}
		if err := s.Release(ctx, l, store.Completion{Status: store.StatusRetryable, TTL: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Release of a lease past its purge time = %v; want ErrLeaseLost", err)
		}
	})
}

// A Complete that moves an aged lease's row while claims of the key run
// from 8 connections: every claim finds the row, held before the move and
// replayed after it, and the key keeps one row. The move takes the key's
// lock, so no claim's lookup misses the row between its two partitions.
func TestPartitionedMoveUnderConcurrentClaims(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 12 })
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.Options{})
	ctx := t.Context()
	req := store.LeaseRequest{Scope: "s", LeaseDuration: time.Minute, Retain: time.Hour}
	for round := range 10 {
		req.Key = fmt.Sprintf("k%d", round)
		res, err := s.ClaimLease(ctx, req)
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimLease = %+v, %v", res, err)
		}
		ageLease(t, pool, schema, req.Key)
		var wg sync.WaitGroup
		errs := make(chan error, 8*50)
		done := make(chan struct{})
		for range 8 {
			wg.Go(func() {
				for i := 0; i < 50; i++ {
					r, err := s.ClaimLease(ctx, req)
					switch {
					case err != nil:
						errs <- err
						return
					case r.Decision != store.DecisionHeld && r.Decision != store.DecisionReplay:
						errs <- fmt.Errorf("claim during the move: decision %v; want Held or Replay", r.Decision)
						return
					}
					select {
					case <-done:
						return
					default:
					}
				}
			})
		}
		time.Sleep(time.Millisecond)
		if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: []byte("r"), TTL: time.Hour}); err != nil {
			t.Fatalf("Complete: %v", err)
		}
		close(done)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if rows := rowsOf(t, pool, schema, "s", req.Key); len(rows) != 1 || strings.HasSuffix(rows[0], "aged") {
			t.Fatalf("round %d: the key's rows are in %v; want one, moved", round, rows)
		}
	}
}

// A lease whose partition closed and was read for its key filter while
// the lease lived, extended after that read: the Extend moves its row out,
// so the drop, unread, when the read's time for the partition has come,
// leaves the lease whole (Get, Complete). Four-second partitions: the
// filter is due a sixtieth of a width after the range ends.
func TestPartitionedLeaseExtendedAfterTheFilterReadOutlivesTheDrop(t *testing.T) {
	t.Parallel()
	const width = 4 * time.Second
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.WithPartitionWidth(postgres.Options{}, width))
	ctx := t.Context()
	now := dbNow(t, pool)
	time.Sleep(now.Truncate(width).Add(width + 100*time.Millisecond).Sub(now)) // early in a partition
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "long", LeaseDuration: 2 * width, Retain: time.Millisecond})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease = %+v, %v", res, err)
	}
	first := rowsOf(t, pool, schema, "s", "long")
	claimed := claimedAt(t, pool, schema, "long")
	time.Sleep(time.Until(claimed.Truncate(width).Add(width + 300*time.Millisecond)))
	if removed, _, err := s.CleanupPass(ctx); err != nil || removed != 0 {
		t.Fatalf("the pass after the lease's partition closed = %d rows, %v; want its key filter read, nothing dropped", removed, err)
	}
	if rows := rowsOf(t, pool, schema, "s", "long"); len(rows) != 1 || rows[0] != first[0] {
		t.Fatalf("after the filter's read the lease's rows are in %v; want it still in %v", rows, first)
	}
	ext, err := s.Extend(ctx, res.Claim, time.Hour)
	if err != nil {
		t.Fatalf("Extend: %v", err)
	}
	time.Sleep(time.Until(res.Claim.ExpiresAt.Add(200 * time.Millisecond)))
	if _, _, err := s.CleanupPass(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range partitionsOf(t, pool, schema) {
		if strings.HasSuffix(first[0], p.name) {
			t.Fatalf("the lease's first partition %s is still there after its rows' time", p.name)
		}
	}
	if rec, err := s.Get(ctx, "s", "long"); err != nil || rec.Status != store.StatusInProgress || rec.Token != res.Claim.Token {
		t.Fatalf("Get after the drop = %+v, %v; want the extended lease", rec, err)
	}
	if err := s.Complete(ctx, ext, store.Completion{Status: store.StatusSucceeded, Result: []byte("r"), TTL: time.Hour}); err != nil {
		t.Fatalf("Complete of the extended lease after the drop: %v", err)
	}
}
