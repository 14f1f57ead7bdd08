package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

type beginOutcome struct {
	res store.ClaimResult
	err error
}

// The READ COMMITTED corner of ClaimLease's single statement: another transaction
// commits the row after the statement took its snapshot. The upsert then
// sees the newest version (and does not take the key) while the read of the
// row sees the older one, or none. The statement runs again for that key
// and answers from the committed state.
func TestBeginReadCommittedCorner(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema})
	qualified := table(schema, "")
	seq := schema + "." + postgres.DefaultTable + "_token_seq"
	ctx := t.Context()

	// race runs Begin(key) while tx, which wrote the key's row, is still
	// open, and commits tx once the ClaimLease waits for its lock.
	race := func(key string, write string) (store.ClaimResult, int64) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(context.Background()) //nolint:errcheck
		var token int64
		if err := tx.QueryRow(ctx, write, key).Scan(&token); err != nil {
			t.Fatal(err)
		}
		reruns := s.Reruns()
		done := make(chan beginOutcome, 1)
		go func() {
			res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "c", Key: key, LeaseDuration: time.Minute})
			done <- beginOutcome{res, err}
		}()
		waitForLockWait(t, pool, schema)
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		o := <-done
		if o.err != nil {
			t.Fatalf("Begin(%s): %v", key, o.err)
		}
		if got := s.Reruns() - reruns; got != 1 {
			t.Errorf("Begin(%s) ran its statement again %d times, want 1", key, got)
		}
		return o.res, token
	}

	// 1. The row did not exist for the snapshot: inserted and committed by
	// another worker meanwhile. Neither inserted nor visible at first.
	res, token := race("absent", `INSERT INTO `+qualified+`
		(scope, key, status, token, attempt, purge_at, expires_at, created_at, updated_at)
		VALUES ('c', $1, 1, nextval('`+seq+`'), 1, now() + interval '1 hour', now() + interval '1 hour', now(), now())
		RETURNING token`)
	if res.Decision != store.DecisionHeld || res.Record.Token != token {
		t.Fatalf("ClaimLease after a concurrent insert = %v (record %+v), want held with token %d", res.Decision, res.Record, token)
	}

	// 2. The snapshot saw an expired lease (takeable), but another worker
	// took it over meanwhile: the upsert sees the new live lease.
	first, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "c", Key: "expired", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	advance(t, pool, qualified, 2*time.Minute)
	res, token = race("expired", `UPDATE `+qualified+` SET token = nextval('`+seq+`'), attempt = attempt + 1,
		expires_at = now() + interval '1 hour'
		WHERE scope = 'c' AND key = $1 RETURNING token`)
	if res.Decision != store.DecisionHeld || res.Record.Token != token || token <= first.Claim.Token {
		t.Fatalf("ClaimLease after a concurrent takeover = %v (record %+v), want held with the new token %d", res.Decision, res.Record, token)
	}
}
