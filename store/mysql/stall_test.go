package mysql_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/mysql"
)

// A connection that stalls makes every store operation fail within its
// bound, Options.StatementTimeout (plus a claim's Wait), and Close return:
// nothing waits for the stall to end.
func TestStalledServerFailsOperationsWithinTheirBound(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDBDatabase(t)
	newStore(t, testenv.MariaDB(t, dsn), mysql.Options{}) // migrated
	p, db := proxied(t, dsn, 4)
	const bound, wait = 500 * time.Millisecond, time.Second
	s, err := mysql.New(db, mysql.Options{StatementTimeout: bound, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background() // no deadline of the test's own: the bound must come from the store

	// Before the stall: a lease, and a one-transaction claim in flight.
	begun, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "leased", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := s.ClaimInTx(ctx, store.TxRequest{Key: "claimed", SuccessTTL: time.Hour, Wait: wait})
	if err != nil || claimed.Decision != store.DecisionExecute {
		t.Fatalf("Claim = %v, %v", claimed.Decision, err)
	}
	rolled, err := s.ClaimInTx(ctx, store.TxRequest{Key: "rolled", SuccessTTL: time.Hour, Wait: wait})
	if err != nil || rolled.Decision != store.DecisionExecute {
		t.Fatalf("Claim = %v, %v", rolled.Decision, err)
	}

	stall(t, p)
	ops := []struct {
		name  string
		bound time.Duration
		run   func() error
	}{
		{"Commit", bound, func() error { return claimed.Tx.Commit(ctx, []byte("r")) }},
		{"Rollback", bound, func() error { return rolled.Tx.Rollback(ctx) }},
		{"ClaimLease", bound, func() error {
			_, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "new", LeaseDuration: time.Minute})
			return err
		}},
		{"ClaimInTx", bound + wait, func() error {
			_, err := s.ClaimInTx(ctx, store.TxRequest{Key: "new2", SuccessTTL: time.Hour, Wait: wait})
			return err
		}},
		{"Complete", bound, func() error {
			return s.Complete(ctx, begun.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour})
		}},
		{"Extend", bound, func() error { _, err := s.Extend(ctx, begun.Claim, time.Minute); return err }},
		{"Release", bound, func() error {
			return s.Release(ctx, begun.Claim, store.Completion{Status: store.StatusRetryable, TTL: time.Minute})
		}},
		{"RecordRollback", bound, func() error {
			return s.RecordRollback(ctx, claimed.Claim, "", store.Completion{Status: store.StatusRetryable, TTL: time.Hour})
		}},
		{"Get", bound, func() error { _, err := s.Get(ctx, "", "leased"); return err }},
		{"List", bound, func() error { _, err := s.List(ctx, store.ListRequest{}); return err }},
		{"Delete", bound, func() error { return s.Delete(ctx, "", "other", 1) }},
		{"DeleteExpired", bound, func() error { _, err := s.DeleteExpired(ctx, 10); return err }},
		{"CleanupPass", bound, func() error { _, _, err := s.CleanupPass(ctx); return err }},
	}
	// A liveness margin over each bound, for a loaded machine: what this
	// checks is that an operation ends near its bound, not at the stall's.
	const margin = 2 * time.Second
	for _, op := range ops {
		start := time.Now()
		err := op.run()
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s against a stalled server = %v, want an error wrapping context.DeadlineExceeded", op.name, err)
		}
		if took > op.bound+margin {
			t.Errorf("%s against a stalled server took %v, want its bound %v (and at most %v more)", op.name, took, op.bound, margin)
		}
	}
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	<-closed // the test binary's -timeout is the guard
}

// A Commit whose answer comes after Options.StatementTimeout returns at
// the bound; the COMMIT it sent still lands, and its connection comes back
// to the pool when the answer arrives.
func TestLateCommitReturnsAtItsBoundAndGivesBackItsConnection(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDBDatabase(t)
	newStore(t, testenv.MariaDB(t, dsn), mysql.Options{}) // migrated
	p, db := proxied(t, dsn, 2)
	const bound = 500 * time.Millisecond
	s, err := mysql.New(db, mysql.Options{StatementTimeout: bound, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	claimed, err := s.ClaimInTx(ctx, store.TxRequest{Key: "late", SuccessTTL: time.Hour, Wait: time.Second})
	if err != nil || claimed.Decision != store.DecisionExecute {
		t.Fatalf("Claim = %v, %v", claimed.Decision, err)
	}
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(`{"name":"late","type":"latency","stream":"downstream","toxicity":1,"attributes":{"latency":2000}}`)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = claimed.Tx.Commit(ctx, nil)
	if took := time.Since(start); !errors.Is(err, context.DeadlineExceeded) || took > bound+2*time.Second {
		t.Fatalf("Commit with a 2 s answer = %v after %v; want context.DeadlineExceeded near %v", err, took, bound)
	}
	testenv.WaitFor(t, 10*time.Second, "the connection back in the pool", func() bool { st := db.Stats(); return st.InUse == 0 && st.Idle > 0 })
	if err := p.Toxics.RemoveToxic(ctx, "late"); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "", "late")
	if err != nil || rec.Status != store.StatusSucceeded {
		t.Fatalf("Get after the late commit = %+v, %v; want the committed record", rec, err)
	}
}
