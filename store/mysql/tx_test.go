package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/mysql"
)

func txReq(key string, wait time.Duration) store.TxRequest {
	return store.TxRequest{Scope: "s", Key: key, Fingerprint: "fp", SuccessTTL: time.Hour, Wait: wait}
}

func businessRows(t *testing.T, db *sql.DB, id string) int {
	t.Helper()
	var n int
	if err := db.QueryRowContext(t.Context(), "SELECT COUNT(*) FROM payments WHERE id = ?", id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// The handler's writes, made through TxFromContext, commit with the record
// of its success, or roll back with its claim.
func TestTxBusinessWritesCommitWithTheRecord(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	s := newStore(t, db, mysql.Options{})
	if _, err := db.ExecContext(t.Context(), "CREATE TABLE payments (id VARCHAR(64) PRIMARY KEY)"); err != nil {
		t.Fatal(err)
	}
	pay := func(key string, commit bool) {
		t.Helper()
		res, err := s.ClaimInTx(t.Context(), txReq(key, time.Second))
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimInTx(%q) = %v, %v; want Execute", key, res.Decision, err)
		}
		tx, ok := mysql.TxFromContext(res.Tx.Context(t.Context()))
		if !ok {
			t.Fatal("TxFromContext found no transaction in the claim's context")
		}
		if _, err := tx.ExecContext(t.Context(), "INSERT INTO payments VALUES (?)", key); err != nil {
			t.Fatal(err)
		}
		if commit {
			err = res.Tx.Commit(t.Context(), []byte("r"))
		} else {
			err = res.Tx.Rollback(t.Context())
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	pay("kept", true)
	pay("undone", false)
	if n := businessRows(t, db, "kept"); n != 1 {
		t.Fatalf("committed payment rows = %d, want 1", n)
	}
	if rec, err := s.Get(t.Context(), "s", "kept"); err != nil || rec.Status != store.StatusSucceeded || string(rec.Result) != "r" {
		t.Fatalf("record of the commit = %+v, %v; want a success with its result", rec, err)
	}
	if n := businessRows(t, db, "undone"); n != 0 {
		t.Fatalf("rolled-back payment rows = %d, want 0", n)
	}
	if _, err := s.Get(t.Context(), "s", "undone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record of the rollback = %v, want ErrNotFound", err)
	}
	if _, ok := mysql.TxFromContext(t.Context()); ok {
		t.Fatal("TxFromContext found a transaction outside the mode")
	}
}

// A duplicate that meets the key in another delivery's open transaction
// waits on its row lock, bounded by innodb_lock_wait_timeout (its wait to
// the nearest second; none below half a second), and then answers Held,
// contended; a wait that sees the holder
// commit replays what it committed.
func TestTxDuplicateWaitsOnTheRowLock(t *testing.T) {
	t.Parallel()
	s := newStore(t, testDB(t), mysql.Options{})
	first, err := s.ClaimInTx(t.Context(), txReq("k", time.Second))
	if err != nil || first.Decision != store.DecisionExecute {
		t.Fatalf("first claim = %v, %v", first.Decision, err)
	}
	for _, wait := range []time.Duration{time.Millisecond, 1200 * time.Millisecond} {
		start := time.Now()
		held, err := s.ClaimInTx(t.Context(), txReq("k", wait))
		waited := time.Since(start)
		if err != nil || held.Decision != store.DecisionHeld || !held.Contended || held.Tx != nil {
			t.Fatalf("duplicate past its wait %v = %+v, %v; want Held, contended, no transaction", wait, held, err)
		}
		bound := time.Duration(mysql.WaitSecs(wait)) * time.Second // 0 and 1 s
		if waited < bound {
			t.Fatalf("the duplicate with wait %v answered after %v, before the lock wait bound %v: it did not wait", wait, waited, bound)
		}
		if bound == 0 && waited >= time.Second {
			t.Fatalf("the duplicate with wait %v answered after %v: it waited (innodb_lock_wait_timeout counts whole seconds)", wait, waited)
		}
	}

	done := make(chan store.TxResult, 1)
	go func() {
		res, err := s.ClaimInTx(context.Background(), txReq("k", 30*time.Second))
		if err != nil {
			t.Errorf("waiting duplicate: %v", err)
		}
		done <- res
	}()
	time.Sleep(100 * time.Millisecond) // let it meet the lock (it replays either way)
	if err := first.Tx.Commit(t.Context(), []byte("first")); err != nil {
		t.Fatal(err)
	}
	if res := <-done; res.Decision != store.DecisionReplay || string(res.Record.Result) != "first" || !res.Contended {
		t.Fatalf("duplicate that waited = %v contended %v (record %+v), want a contended replay of the first", res.Decision, res.Contended, res.Record)
	}
	// A duplicate of the committed key meets no open transaction.
	if res, err := s.ClaimInTx(t.Context(), txReq("k", time.Second)); err != nil || res.Decision != store.DecisionReplay || res.Contended {
		t.Fatalf("a later duplicate = %+v, %v; want an uncontended replay", res, err)
	}
}

// A lease operation that meets the row locked past its bound fails with a
// retryable error (no store sentinel) that says the row was busy.
func TestLockWaitTimeoutIsRetryable(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	s := newStore(t, db, mysql.Options{StatementTimeout: 3 * time.Second})
	res, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(t.Context(), "SELECT 1 FROM oncemill_records WHERE scope = 's' AND `key` = 'k' FOR UPDATE"); err != nil {
		t.Fatal(err)
	}
	err = s.Complete(t.Context(), res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour})
	for _, sentinel := range []error{store.ErrLeaseLost, store.ErrInvalidRequest, store.ErrNotFound, store.ErrClosed} {
		if errors.Is(err, sentinel) {
			t.Fatalf("Complete on a locked row = %v; want a retryable error, not %v", err, sentinel)
		}
	}
	if err == nil || !strings.Contains(err.Error(), "innodb_lock_wait_timeout") {
		t.Fatalf("Complete on a locked row = %v; want the lock wait timeout", err)
	}
	tx.Rollback() //nolint:errcheck
	if err := s.Complete(t.Context(), res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
		t.Fatalf("Complete once the row is free: %v", err)
	}
}
