package postgres_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// retryAt is the partition's retry_at (nil: none).
func (f *wmFast) retryAt(t *testing.T) *time.Time {
	t.Helper()
	var at *time.Time
	q := "SELECT retry_at FROM " + pgx.Identifier{f.schema, postgres.DefaultTable + "_watermarks"}.Sanitize() + " WHERE group_id = 'g' AND topic = 't'"
	if err := f.pool.QueryRow(t.Context(), q).Scan(&at); err != nil {
		t.Fatal(err)
	}
	return at
}

// passPause moves the partition's retry_at d earlier, as if d passed on the
// database clock.
func (f *wmFast) passPause(t *testing.T, d time.Duration) {
	t.Helper()
	q := "UPDATE " + pgx.Identifier{f.schema, postgres.DefaultTable + "_watermarks"}.Sanitize() +
		" SET retry_at = retry_at - $1 * interval '1 microsecond' WHERE group_id = 'g' AND topic = 't'"
	if _, err := f.pool.Exec(t.Context(), q, d.Microseconds()); err != nil {
		t.Fatal(err)
	}
}

// rollBackAt claims offset (which must execute, at attempt want), rolls the
// transaction back and records out.
func rollBackAt(t *testing.T, w store.Transactional, offset int64, want int, out store.Completion) {
	t.Helper()
	res := claimAt(t, w, offset)
	if res.Decision != store.DecisionExecute || res.Claim.Attempt != want {
		t.Fatalf("offset %d: %v at attempt %d, want execute at attempt %d", offset, res.Decision, res.Claim.Attempt, want)
	}
	if err := res.Tx.Rollback(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := w.RecordRollback(t.Context(), res.Claim, "", out); err != nil {
		t.Fatalf("offset %d: record rollback: %v", offset, err)
	}
}

// heldAt claims offset and wants it held back by the pause, with attempt
// attempts counted.
func heldAt(t *testing.T, w store.Transactional, offset int64, attempts int, pause time.Duration) {
	t.Helper()
	res := claimAt(t, w, offset)
	if res.Decision != store.DecisionHeld || res.Tx != nil || res.Contended {
		t.Fatalf("offset %d: %v, tx %v, contended %v; want held back, no transaction, not contended", offset, res.Decision, res.Tx, res.Contended)
	}
	if res.RetryIn <= pause-10*time.Second || res.RetryIn > pause {
		t.Fatalf("offset %d: RetryIn %v, want just under %v", offset, res.RetryIn, pause)
	}
	if r := res.Record; r == nil || r.Status != store.StatusRetryable || r.Attempt != attempts {
		t.Fatalf("offset %d: record %+v, want retryable at attempt %d", offset, r, attempts)
	}
}

// The watermark row keeps the pause after a retryable failure
// (Completion.RetryAfter) for the offset whose attempts it counts: every
// owner's claim of that offset is held back, changes nothing and is no
// attempt, in the claim's one statement; the claim after the pause runs the
// next attempt. An uncounted rollback keeps the count; a success, or a
// cached failure, of the offset clears the pause, and the next offset runs.
func TestWatermarkRetryAfterHoldsBack(t *testing.T) {
	t.Parallel()
	f := newWMFast(t, postgres.Options{})
	ctx := t.Context()
	const pause = time.Minute
	retry := store.Completion{Status: store.StatusRetryable, TTL: time.Hour, RetryAfter: pause}
	commitAt(t, f.w, 0)
	rollBackAt(t, f.w, 1, 1, retry)
	if f.retryAt(t) == nil {
		t.Fatal("no retry_at after a retryable rollback with RetryAfter")
	}
	before := f.count.load()
	heldAt(t, f.w, 1, 1, pause)
	if d := f.count.load().minus(before); d.statements != 3 || d.commits != 0 {
		t.Fatalf("a held-back claim: %+v, want BEGIN, the claim and ROLLBACK, no commit", d)
	}
	heldAt(t, f.watermarks(t), 1, 1, pause) // another owner: the pause is the row's
	if ws, err := f.st.Watermarks(ctx, "g", "t"); err != nil || ws[0].Next != 1 || ws[0].AttemptOffset != 1 || ws[0].Attempts != 1 {
		t.Fatalf("after the held-back claims: %+v, %v; want the watermark at 1 and 1 attempt of offset 1", ws, err)
	}

	// After the pause, the next attempt; given back (Uncounted), it keeps
	// the count, and its own pause holds the offset back again.
	f.passPause(t, pause)
	rollBackAt(t, f.w, 1, 2, store.Completion{Status: store.StatusRetryable, TTL: time.Hour, RetryAfter: pause, Uncounted: true})
	heldAt(t, f.w, 1, 1, pause)
	f.passPause(t, pause)
	res := claimAt(t, f.w, 1)
	if res.Decision != store.DecisionExecute || res.Claim.Attempt != 2 {
		t.Fatalf("after the uncounted attempt's pause: %v at attempt %d, want execute at attempt 2", res.Decision, res.Claim.Attempt)
	}
	if err := res.Tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if f.retryAt(t) != nil || f.next(t) != 2 {
		t.Fatalf("after the success: retry_at %v, watermark %d; want none, 2", f.retryAt(t), f.next(t))
	}

	// A pause of offset 2 left by a failure, then a cached failure of it:
	// the watermark moves past it, the pause goes, offset 3 runs.
	other := f.watermarks(t)
	rollBackAt(t, other, 2, 1, retry)
	heldAt(t, other, 2, 1, pause)
	f.passPause(t, pause)
	res = claimAt(t, other, 2)
	if res.Decision != store.DecisionExecute || res.Claim.Attempt != 2 {
		t.Fatalf("offset 2 after the pause: %v at attempt %d", res.Decision, res.Claim.Attempt)
	}
	if err := res.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.RecordRollback(ctx, res.Claim, "", retry); err != nil {
		t.Fatal(err)
	}
	if err := other.RecordRollback(ctx, res.Claim, "", store.Completion{Status: store.StatusCachedFailure, ErrorKind: store.ErrorKindCached, ErrorMessage: "declined"}); err != nil {
		t.Fatal(err)
	}
	if f.retryAt(t) != nil || f.next(t) != 3 {
		t.Fatalf("after the cached failure: retry_at %v, watermark %d; want none, 3", f.retryAt(t), f.next(t))
	}
	if res := claimAt(t, other, 2); res.Decision != store.DecisionReplay {
		t.Fatalf("offset 2's redelivery: %v, want its cached failure replayed", res.Decision)
	}
	if res := claimAt(t, other, 3); res.Decision != store.DecisionExecute || res.Claim.Attempt != 1 {
		t.Fatalf("offset 3: %v at attempt %d, want execute at attempt 1", res.Decision, res.Claim.Attempt)
	} else if err := res.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	// A retryable rollback without a pause holds nothing back.
	rollBackAt(t, other, 3, 1, store.Completion{Status: store.StatusRetryable, TTL: time.Hour})
	if f.retryAt(t) != nil {
		t.Fatal("a rollback without RetryAfter left retry_at")
	}
	commitAt(t, other, 3)
}
