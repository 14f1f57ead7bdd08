package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

func TestClose(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := newStore(t, pool, postgres.Options{CleanupInterval: time.Millisecond})
	ctx := t.Context()
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "k", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// A claim taken before Close can still end after it.
	claim, err := s.ClaimInTx(ctx, store.TxRequest{Key: "claimed", SuccessTTL: time.Minute, Wait: time.Second})
	if err != nil || claim.Decision != store.DecisionExecute {
		t.Fatalf("Claim = %v, %v", claim.Decision, err)
	}

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ops := map[string]error{}
	_, ops["ClaimLease"] = s.ClaimLease(ctx, store.LeaseRequest{Key: "k", LeaseDuration: time.Minute})
	ops["Complete"] = s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Minute})
	ops["Release"] = s.Release(ctx, res.Claim, store.Completion{Status: store.StatusRetryable, TTL: time.Minute})
	_, ops["Extend"] = s.Extend(ctx, res.Claim, time.Minute)
	_, ops["Get"] = s.Get(ctx, "", "k")
	ops["Delete"] = s.Delete(ctx, "", "k", res.Claim.Token)
	_, ops["DeleteExpired"] = s.DeleteExpired(ctx, 10)
	_, ops["Claim"] = s.ClaimInTx(ctx, store.TxRequest{Key: "k2", SuccessTTL: time.Minute, Wait: time.Second})
	ops["RecordRollback"] = s.RecordRollback(ctx, res.Claim, "", store.Completion{Status: store.StatusRetryable, TTL: time.Minute})
	for op, err := range ops {
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", op, err)
		}
	}
	if err := claim.Tx.Commit(ctx, nil); err != nil {
		t.Fatalf("commit of a claim taken before Close: %v", err)
	}
}

// Close waits for an operation under way, and that operation is bounded:
// a ClaimLease blocked on a row lock gives up after Options.StatementTimeout,
// and Close returns then.
func TestCloseWaitsForOperationsWithinTheirBound(t *testing.T) {
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	const timeout = 300 * time.Millisecond
	s := newStore(t, pool, postgres.Options{Schema: schema, StatementTimeout: timeout})
	ctx := t.Context()
	if _, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "held", LeaseDuration: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// Another session holds the row, so a takeover waits for its lock.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background()) //nolint:errcheck
	if _, err := tx.Exec(ctx, "SELECT 1 FROM "+table(schema, "")+" WHERE key = 'held' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	begun := make(chan error, 1)
	go func() {
		_, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "held", LeaseDuration: time.Minute})
		begun <- err
	}()
	waitForLockWait(t, pool, schema)
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a ClaimLease was still under way")
	case <-time.After(timeout / 3):
	}
	if err := <-begun; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("ClaimLease blocked past StatementTimeout = %v, want context.DeadlineExceeded", err)
	}
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return after the bounded ClaimLease gave up")
	}
}

// AppliedVersion is 0 before the first Migrate and SchemaVersion after it.
func TestAppliedVersion(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if v, err := s.AppliedVersion(t.Context()); err != nil || v != 0 {
		t.Fatalf("AppliedVersion before Migrate = %d, %v; want 0", v, err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if v, err := s.AppliedVersion(t.Context()); err != nil || v != postgres.SchemaVersion {
		t.Fatalf("AppliedVersion after Migrate = %d, %v; want %d", v, err, postgres.SchemaVersion)
	}
}
