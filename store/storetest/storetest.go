package storetest

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/storeload"
)

// Harness is what a store's test gives the suite.
type Harness struct {
	// Store is the store under test: what every store of oncemill
	// implements, the delivery path and the operator's operations. When it
	// also implements store.Transactional, Run checks the one-transaction
	// mode too; when it has a DeleteExpired(ctx, limit) (int, error) method
	// (store/postgres's), Run checks that as well.
	Store interface {
		store.Store
		store.Admin
	}
	// Advance moves the store's clock forward by d. Stores judged by a server
	// clock (PostgreSQL now(), Redis TIME) implement it by moving every stored
	// deadline d earlier.
	Advance func(d time.Duration)
	// NativeExpiry says the store frees expired records by itself (Redis's
	// TTLs): Run then checks that an expired record is gone, not just
	// hidden, once Advance has passed its expiry and its claim's Retain.
	NativeExpiry bool
}

// expirer is a store that removes expired records on request, up to limit
// at a time, and returns how many it removed. A record is kept at least for
// the Retain of the ClaimLease that claimed it, beyond its lease, so that an
// expired lease carries its attempt count to the next ClaimLease; after
// that, expired leases are removed too, and the next ClaimLease of their key
// starts again at attempt 1. A limit that is not positive is
// store.ErrInvalidRequest.
type expirer interface {
	DeleteExpired(ctx context.Context, limit int) (int, error)
}

// Run runs the contract suite against the stores newHarness builds. It calls
// newHarness once per subtest, with that subtest's t.
//
// What a store has beyond Store is found on the Harness.Store of a
// subtest, so the checks of those capabilities are groups of subtests that
// look first: DeleteExpired (a store with that method), NativeExpiry
// (Harness.NativeExpiry) and Transactional (a store.Transactional, whose
// contract runs under Transactional/). A store without the capability
// skips its group, saying so.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	t.Helper()

	tests := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"BeginAbsentKeyExecutes", testBeginAbsentKeyExecutes},
		{"ConcurrentBeginsExecuteOnce", testConcurrentBeginsExecuteOnce},
		{"CompleteSuccessReplays", testCompleteSuccessReplays},
		{"CompleteFailureReplays", testCompleteFailureReplays},
		{"TakeoverAfterLeaseExpiry", testTakeoverAfterLeaseExpiry},
		{"InProgressBeforeLeaseExpiry", testInProgressBeforeLeaseExpiry},
		{"StaleAndUnknownTokens", testStaleAndUnknownTokens},
		{"FinishedRecordsExpire", testFinishedRecordsExpire},
		{"FingerprintMismatch", testFingerprintMismatch},
		{"ExtendKeepsLease", testExtendKeepsLease},
		{"AttemptsCountedAcrossRelease", testAttemptsCountedAcrossRelease},
		{"ReleaseStaleLease", testReleaseStaleLease},
		{"RetryAfterHoldsTheNextAttemptBack", testRetryAfterHoldsTheNextAttemptBack},
		{"UncountedReleaseKeepsTheCount", testUncountedReleaseKeepsTheCount},
		{"Delete", testDelete},
		{"DeleteUnderTheReadToken", testDeleteUnderTheReadToken},
		{"AttemptsSurviveCleanupForRetain", testAttemptsSurviveCleanupForRetain},
		{"InvalidRequests", testInvalidRequests},
		{"ScopesIsolate", testScopesIsolate},
		{"ConcurrentStress", testConcurrentStress},
		{"TokensIncrease", testTokensIncrease},
		{"KeyLimit", testKeyLimit},
		{"ListFiltersAndPages", testListFiltersAndPages},
		{"MessageUUID", testMessageUUID},
		{"DeleteExpired", testDeleteExpired},
		{"NativeExpiry", testNativeExpiry},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.run(t, newEnv(t, newHarness(t)))
		})
	}
	t.Run("Transactional", func(t *testing.T) {
		if _, ok := newHarness(t).Store.(store.Transactional); !ok {
			t.Skip("storetest: the store is not a store.Transactional")
		}
		runTransactional(t, func(t *testing.T) *env { return newEnv(t, newHarness(t)) })
	})
}

// newEnv checks h and makes the env of the subtest t.
func newEnv(t *testing.T, h Harness) *env {
	t.Helper()
	if h.Store == nil {
		t.Fatal("storetest: Harness.Store is nil")
	}
	if h.Advance == nil {
		t.Fatal("storetest: Harness.Advance is nil")
	}
	return &env{
		t:       t,
		ctx:     t.Context(),
		s:       h.Store,
		advance: h.Advance,
		native:  h.NativeExpiry,
		scope:   "storetest/" + t.Name() + "/" + rand.Text()[:10],
	}
}

// Durations used throughout. The margins around every expiry are at least a
// second so that stores on a real server clock pass while the test runs.
const (
	lease = 10 * time.Second
	ttl   = time.Hour
)

// env is one subtest's view of the store: its scope and helpers that fail
// the test on unexpected errors.
type env struct {
	t   *testing.T
	ctx context.Context
	s   interface {
		store.Store
		store.Admin
	}
	advance func(time.Duration)
	native  bool // Harness.NativeExpiry
	scope   string
}

func (e *env) req(key, fp string, d time.Duration) store.LeaseRequest {
	return store.LeaseRequest{Scope: e.scope, Key: key, Fingerprint: fp, LeaseDuration: d}
}

func (e *env) begin(key, fp string, d time.Duration) store.ClaimResult {
	e.t.Helper()
	res, err := e.s.ClaimLease(e.ctx, e.req(key, fp, d))
	if err != nil {
		e.t.Fatalf("Begin(%q, fp %q): %v", key, fp, err)
	}
	return res
}

// expect calls ClaimLease and checks its decision.
func (e *env) expect(want store.Decision, key, fp string, d time.Duration) store.ClaimResult {
	e.t.Helper()
	res := e.begin(key, fp, d)
	if res.Decision != want {
		e.t.Fatalf("Begin(%q, fp %q) = %v, want %v (record %+v)", key, fp, res.Decision, want, res.Record)
	}
	return res
}

// execute calls ClaimLease, expects Execute and returns the lease.
func (e *env) execute(key, fp string) store.Claim {
	e.t.Helper()
	return e.expect(store.DecisionExecute, key, fp, lease).Claim
}

func (e *env) complete(l store.Claim, out store.Completion) {
	e.t.Helper()
	if err := e.s.Complete(e.ctx, l, out); err != nil {
		e.t.Fatalf("Complete(%q, token %d): %v", l.Key, l.Token, err)
	}
}

// retryable is what a retryable failure leaves: its attempt count, for keep.
func retryable(keep time.Duration) store.Completion {
	return store.Completion{Status: store.StatusRetryable, TTL: keep}
}

func (e *env) release(l store.Claim, keep time.Duration) {
	e.t.Helper()
	e.releaseAs(l, retryable(keep))
}

func (e *env) releaseAs(l store.Claim, out store.Completion) {
	e.t.Helper()
	if err := e.s.Release(e.ctx, l, out); err != nil {
		e.t.Fatalf("Release(%q, token %d): %v", l.Key, l.Token, err)
	}
}

func (e *env) get(key string) store.Record {
	e.t.Helper()
	rec, err := e.s.Get(e.ctx, e.scope, key)
	if err != nil {
		e.t.Fatalf("Get(%q): %v", key, err)
	}
	return rec
}

func (e *env) getNotFound(key string) {
	e.t.Helper()
	rec, err := e.s.Get(e.ctx, e.scope, key)
	if !errors.Is(err, store.ErrNotFound) {
		e.t.Fatalf("Get(%q) = %+v, %v; want ErrNotFound", key, rec, err)
	}
}

// leaseLost checks that op failed with ErrLeaseLost.
func (e *env) leaseLost(op string, err error) {
	e.t.Helper()
	if !errors.Is(err, store.ErrLeaseLost) {
		e.t.Fatalf("%s: err = %v, want ErrLeaseLost", op, err)
	}
}

func (e *env) invalid(op string, err error) {
	e.t.Helper()
	if !errors.Is(err, store.ErrInvalidRequest) {
		e.t.Fatalf("%s: err = %v, want ErrInvalidRequest", op, err)
	}
}

func success(result []byte) store.Completion {
	return store.Completion{Status: store.StatusSucceeded, Result: result, TTL: ttl}
}

// closeTo reports whether a and b are within a millisecond: stores may keep
// times at millisecond (Redis) or microsecond (PostgreSQL) precision.
func closeTo(a, b time.Time) bool {
	d := a.Sub(b)
	return d > -time.Millisecond && d < time.Millisecond
}

func checkRecord(t *testing.T, rec store.Record, scope, key string, status store.Status, attempt int) {
	t.Helper()
	if rec.Scope != scope || rec.Key != key {
		t.Errorf("record is for (%q, %q), want (%q, %q)", rec.Scope, rec.Key, scope, key)
	}
	if rec.Status != status {
		t.Errorf("record status = %v, want %v", rec.Status, status)
	}
	if rec.Attempt != attempt {
		t.Errorf("record attempt = %d, want %d", rec.Attempt, attempt)
	}
}

func testBeginAbsentKeyExecutes(t *testing.T, e *env) {
	res := e.expect(store.DecisionExecute, "k", "fp-1", lease)
	l := res.Claim
	if l.Scope != e.scope || l.Key != "k" {
		t.Errorf("lease is for (%q, %q), want (%q, %q)", l.Scope, l.Key, e.scope, "k")
	}
	if l.Token <= 0 {
		t.Errorf("lease token = %d, want > 0", l.Token)
	}
	if l.Attempt != 1 {
		t.Errorf("lease attempt = %d, want 1", l.Attempt)
	}
	if res.Takeover {
		t.Error("Takeover = true on an absent key")
	}
	if l.ExpiresAt.IsZero() {
		t.Error("lease ExpiresAt is zero")
	}

	rec := e.get("k")
	checkRecord(t, rec, e.scope, "k", store.StatusInProgress, 1)
	if rec.Fingerprint != "fp-1" {
		t.Errorf("record fingerprint = %q, want %q", rec.Fingerprint, "fp-1")
	}
	if rec.Token != l.Token {
		t.Errorf("record token = %d, want the lease's %d", rec.Token, l.Token)
	}
	if !closeTo(rec.LeaseExpiresAt, l.ExpiresAt) {
		t.Errorf("record LeaseExpiresAt = %v, want the lease's %v", rec.LeaseExpiresAt, l.ExpiresAt)
	}
	if !rec.ExpiresAt.Equal(rec.LeaseExpiresAt) {
		t.Errorf("in-progress record ExpiresAt = %v, want LeaseExpiresAt %v", rec.ExpiresAt, rec.LeaseExpiresAt)
	}
	if got := rec.LeaseExpiresAt.Sub(rec.UpdatedAt); got < lease-time.Second || got > lease+time.Second {
		t.Errorf("record LeaseExpiresAt - UpdatedAt = %v, want about %v", got, lease)
	}
}

func testConcurrentBeginsExecuteOnce(t *testing.T, e *env) {
	const n = 64
	var (
		start   = make(chan struct{})
		wg      sync.WaitGroup
		mu      sync.Mutex
		results []store.ClaimResult
		errs    []error
	)
	for range n {
		wg.Go(func() {
			<-start
			res, err := e.s.ClaimLease(e.ctx, e.req("k", "fp", lease))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			results = append(results, res)
		})
	}
	close(start)
	wg.Wait()

	if len(errs) > 0 {
		t.Fatalf("%d of %d Begins failed, first: %v", len(errs), n, errs[0])
	}
	var winner store.Claim
	counts := map[store.Decision]int{}
	for _, res := range results {
		counts[res.Decision]++
		if res.Decision == store.DecisionExecute {
			winner = res.Claim
		}
	}
	if counts[store.DecisionExecute] != 1 || counts[store.DecisionHeld] != n-1 {
		t.Fatalf("decisions = %v, want 1 execute and %d in_progress", counts, n-1)
	}
	for _, res := range results {
		if res.Decision == store.DecisionHeld && res.Record.Token != winner.Token {
			t.Fatalf("InProgress record token = %d, want the winner's %d", res.Record.Token, winner.Token)
		}
	}
}

func testCompleteSuccessReplays(t *testing.T, e *env) {
	// Binary, not UTF-8, with NUL bytes: stores must keep bytes, not text.
	want := append([]byte("ok\x00\xff\xfe\x80"), bytes.Repeat([]byte{0, 1, 0xff}, 1000)...)
	result := bytes.Clone(want)

	l := e.execute("k", "fp")
	e.complete(l, success(result))
	result[0] = 'X' // the store copied the result; this changes nothing

	res := e.expect(store.DecisionReplay, "k", "fp", lease)
	checkRecord(t, *res.Record, e.scope, "k", store.StatusSucceeded, 1)
	if !bytes.Equal(res.Record.Result, want) {
		t.Fatalf("replayed result differs from the stored one (%d bytes, want %d)", len(res.Record.Result), len(want))
	}
	if res.Claim.Token != 0 {
		t.Errorf("Replay carries a lease with token %d", res.Claim.Token)
	}
	res.Record.Result[0] = 'Y' // nor does changing what was returned

	rec := e.get("k")
	checkRecord(t, rec, e.scope, "k", store.StatusSucceeded, 1)
	if !bytes.Equal(rec.Result, want) {
		t.Fatal("Get: result differs from the stored one")
	}
	if rec.Fingerprint != "fp" {
		t.Errorf("record fingerprint = %q, want %q", rec.Fingerprint, "fp")
	}
	if !rec.LeaseExpiresAt.IsZero() {
		t.Errorf("succeeded record LeaseExpiresAt = %v, want zero", rec.LeaseExpiresAt)
	}
	if got := rec.ExpiresAt.Sub(rec.UpdatedAt); got < ttl-time.Second || got > ttl+time.Second {
		t.Errorf("record ExpiresAt - UpdatedAt = %v, want about the TTL %v", got, ttl)
	}

	// An empty result is a result too.
	l = e.execute("empty", "")
	e.complete(l, success(nil))
	res = e.expect(store.DecisionReplay, "empty", "", lease)
	if res.Record.Status != store.StatusSucceeded || len(res.Record.Result) != 0 {
		t.Errorf("empty result replayed as %v with %d bytes", res.Record.Status, len(res.Record.Result))
	}
}

func testCompleteFailureReplays(t *testing.T, e *env) {
	l := e.execute("k", "fp")
	e.complete(l, store.Completion{
		Status:       store.StatusCachedFailure,
		ErrorKind:    "validation",
		ErrorMessage: "amount must be positive, got -3 (ünïcode ok)",
		TTL:          ttl,
	})

	for _, rec := range []store.Record{*e.expect(store.DecisionReplay, "k", "fp", lease).Record, e.get("k")} {
		checkRecord(t, rec, e.scope, "k", store.StatusCachedFailure, 1)
		if rec.ErrorKind != "validation" {
			t.Errorf("ErrorKind = %q, want %q", rec.ErrorKind, "validation")
		}
		if rec.ErrorMessage != "amount must be positive, got -3 (ünïcode ok)" {
			t.Errorf("ErrorMessage = %q", rec.ErrorMessage)
		}
	}
}

func testTakeoverAfterLeaseExpiry(t *testing.T, e *env) {
	stale := e.execute("k", "fp")
	e.advance(lease + time.Second)

	res := e.expect(store.DecisionExecute, "k", "fp", lease)
	fresh := res.Claim
	if !res.Takeover {
		t.Error("Takeover = false after the lease expired")
	}
	if fresh.Token <= stale.Token {
		t.Errorf("takeover token %d is not larger than the stale token %d", fresh.Token, stale.Token)
	}
	if fresh.Attempt != 2 {
		t.Errorf("takeover attempt = %d, want 2", fresh.Attempt)
	}

	e.leaseLost("stale Complete", e.s.Complete(e.ctx, stale, success([]byte("stale"))))
	e.leaseLost("stale Release", e.s.Release(e.ctx, stale, retryable(ttl)))
	_, err := e.s.Extend(e.ctx, stale, lease)
	e.leaseLost("stale Extend", err)

	rec := e.get("k")
	checkRecord(t, rec, e.scope, "k", store.StatusInProgress, 2)
	if rec.Token != fresh.Token {
		t.Fatalf("record token = %d after stale calls, want the new holder's %d", rec.Token, fresh.Token)
	}

	e.complete(fresh, success([]byte("fresh")))
	e.leaseLost("stale Complete after the new holder finished", e.s.Complete(e.ctx, stale, success([]byte("stale"))))

	rec = e.get("k")
	checkRecord(t, rec, e.scope, "k", store.StatusSucceeded, 2)
	if string(rec.Result) != "fresh" {
		t.Fatalf("result = %q, want the new holder's %q", rec.Result, "fresh")
	}
}

func testInProgressBeforeLeaseExpiry(t *testing.T, e *env) {
	l := e.execute("k", "fp")
	e.advance(lease - time.Second)

	res := e.expect(store.DecisionHeld, "k", "fp", lease)
	if res.Takeover {
		t.Error("Takeover = true for InProgress")
	}
	if res.Claim.Token != 0 {
		t.Errorf("InProgress carries a lease with token %d", res.Claim.Token)
	}
	checkRecord(t, *res.Record, e.scope, "k", store.StatusInProgress, 1)
	if res.Record.Token != l.Token {
		t.Errorf("record token = %d, want the holder's %d", res.Record.Token, l.Token)
	}
	if res.Record.Fingerprint != "fp" {
		t.Errorf("record fingerprint = %q, want %q", res.Record.Fingerprint, "fp")
	}

	// The holder is undisturbed.
	e.complete(l, success([]byte("done")))
	e.expect(store.DecisionReplay, "k", "fp", lease)
}

func testStaleAndUnknownTokens(t *testing.T, e *env) {
	l := e.execute("done", "")
	e.complete(l, success([]byte("first")))
	e.leaseLost("second Complete", e.s.Complete(e.ctx, l, success([]byte("second"))))
	e.leaseLost("Release after Complete", e.s.Release(e.ctx, l, retryable(ttl)))
	_, err := e.s.Extend(e.ctx, l, lease)
	e.leaseLost("Extend after Complete", err)
	if rec := e.get("done"); rec.Status != store.StatusSucceeded || string(rec.Result) != "first" {
		t.Fatalf("record = %v %q after stale calls, want succeeded %q", rec.Status, rec.Result, "first")
	}

	held := e.execute("held", "")
	for _, token := range []int64{held.Token + 1, held.Token + 1000, held.Token - 1, 0, -1} {
		fake := held
		fake.Token = token
		e.leaseLost(fmt.Sprintf("Complete with made-up token %d", token), e.s.Complete(e.ctx, fake, success(nil)))
		e.leaseLost(fmt.Sprintf("Release with made-up token %d", token), e.s.Release(e.ctx, fake, retryable(ttl)))
		_, err := e.s.Extend(e.ctx, fake, lease)
		e.leaseLost(fmt.Sprintf("Extend with made-up token %d", token), err)
	}
	if rec := e.get("held"); rec.Status != store.StatusInProgress || rec.Token != held.Token {
		t.Fatalf("record = %v token %d after made-up tokens, want in_progress token %d", rec.Status, rec.Token, held.Token)
	}
	e.complete(held, success(nil))

	absent := store.Claim{Scope: e.scope, Key: "absent", Token: held.Token, Attempt: 1}
	e.leaseLost("Complete of an absent key", e.s.Complete(e.ctx, absent, success(nil)))
	e.leaseLost("Release of an absent key", e.s.Release(e.ctx, absent, retryable(ttl)))
	_, err = e.s.Extend(e.ctx, absent, lease)
	e.leaseLost("Extend of an absent key", err)
	e.getNotFound("absent")
}

func testFinishedRecordsExpire(t *testing.T, e *env) {
	ok := e.execute("ok", "fp")
	e.complete(ok, store.Completion{Status: store.StatusSucceeded, Result: []byte("r"), TTL: time.Minute})
	failed := e.execute("failed", "fp")
	e.complete(failed, store.Completion{Status: store.StatusCachedFailure, ErrorKind: "k", ErrorMessage: "m", TTL: time.Minute})

	e.advance(59 * time.Second)
	e.expect(store.DecisionReplay, "ok", "fp", lease)
	e.expect(store.DecisionReplay, "failed", "fp", lease)

	e.advance(2 * time.Second)
	for _, old := range []store.Claim{ok, failed} {
		e.getNotFound(old.Key)
		res := e.expect(store.DecisionExecute, old.Key, "fp", lease)
		if res.Claim.Attempt != 1 || res.Takeover {
			t.Errorf("%s: ClaimLease after expiry = attempt %d, takeover %v; want attempt 1, no takeover", old.Key, res.Claim.Attempt, res.Takeover)
		}
		if res.Claim.Token <= old.Token {
			t.Errorf("%s: token %d after expiry is not larger than the old %d", old.Key, res.Claim.Token, old.Token)
		}
	}
}

func testFingerprintMismatch(t *testing.T, e *env) {
	// While in progress.
	l := e.execute("k", "a")
	res := e.expect(store.DecisionMismatch, "k", "b", lease)
	if res.Record.Fingerprint != "a" || res.Record.Status != store.StatusInProgress {
		t.Errorf("Mismatch record = %v fp %q, want in_progress fp %q", res.Record.Status, res.Record.Fingerprint, "a")
	}
	e.expect(store.DecisionHeld, "k", "", lease)
	e.expect(store.DecisionHeld, "k", "a", lease)

	// After success.
	e.complete(l, success([]byte("r")))
	res = e.expect(store.DecisionMismatch, "k", "b", lease)
	if res.Record.Fingerprint != "a" || res.Record.Status != store.StatusSucceeded {
		t.Errorf("Mismatch record = %v fp %q, want succeeded fp %q", res.Record.Status, res.Record.Fingerprint, "a")
	}
	e.expect(store.DecisionReplay, "k", "", lease)
	e.expect(store.DecisionReplay, "k", "a", lease)

	// After a release: the retry would carry the attempt count on.
	l = e.execute("released", "a")
	e.release(l, ttl)
	e.expect(store.DecisionMismatch, "released", "b", lease)
	if rec := e.get("released"); rec.Status != store.StatusRetryable || rec.Attempt != 1 {
		t.Errorf("Mismatch changed the record: %v attempt %d", rec.Status, rec.Attempt)
	}
	e.expect(store.DecisionExecute, "released", "a", lease)

	// On takeover of an expired lease: same reason, and nothing changes.
	l = e.execute("expired", "a")
	e.advance(lease + time.Second)
	e.expect(store.DecisionMismatch, "expired", "b", lease)
	res = e.expect(store.DecisionExecute, "expired", "a", lease)
	if !res.Takeover || res.Claim.Attempt != 2 || res.Claim.Token <= l.Token {
		t.Errorf("takeover after a Mismatch = takeover %v attempt %d token %d (old %d); want a takeover, attempt 2, larger token",
			res.Takeover, res.Claim.Attempt, res.Claim.Token, l.Token)
	}

	// An empty fingerprint on the stored side is never checked either.
	e.execute("unprinted", "")
	e.expect(store.DecisionHeld, "unprinted", "b", lease)
}

func testExtendKeepsLease(t *testing.T, e *env) {
	l := e.execute("k", "")
	e.advance(8 * time.Second)

	extended, err := e.s.Extend(e.ctx, l, lease)
	if err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if !extended.ExpiresAt.After(l.ExpiresAt) {
		t.Errorf("extended ExpiresAt %v is not later than %v", extended.ExpiresAt, l.ExpiresAt)
	}
	if extended.Token != l.Token || extended.Attempt != l.Attempt || extended.Scope != l.Scope || extended.Key != l.Key {
		t.Errorf("Extend changed the lease's identity: %+v, was %+v", extended, l)
	}

	e.advance(8 * time.Second) // 16s in: past the first expiry, before the extended one
	res := e.expect(store.DecisionHeld, "k", "", lease)
	if res.Record.Token != l.Token {
		t.Errorf("record token = %d, want the holder's %d", res.Record.Token, l.Token)
	}

	// The extended lease is the same lease: it can be extended and completed.
	if _, err := e.s.Extend(e.ctx, extended, lease); err != nil {
		t.Fatalf("second Extend: %v", err)
	}
	e.advance(lease + time.Second)
	_, err = e.s.Extend(e.ctx, l, lease)
	e.leaseLost("Extend after the lease expired", err)
}

func testAttemptsCountedAcrossRelease(t *testing.T, e *env) {
	first := e.execute("k", "fp")
	if first.Attempt != 1 {
		t.Fatalf("first attempt = %d, want 1", first.Attempt)
	}
	e.release(first, time.Hour)
	checkRecord(t, e.get("k"), e.scope, "k", store.StatusRetryable, 1)
	if rec := e.get("k"); !rec.LeaseExpiresAt.IsZero() {
		t.Errorf("retryable record LeaseExpiresAt = %v, want zero", rec.LeaseExpiresAt)
	}

	res := e.expect(store.DecisionExecute, "k", "fp", lease)
	second := res.Claim
	if second.Attempt != 2 || res.Takeover || second.Token <= first.Token {
		t.Fatalf("ClaimLease after Release = attempt %d, takeover %v, token %d (was %d); want attempt 2, no takeover, a larger token",
			second.Attempt, res.Takeover, second.Token, first.Token)
	}
	e.leaseLost("Complete with the released lease", e.s.Complete(e.ctx, first, success(nil)))
	e.release(second, time.Hour)
	checkRecord(t, e.get("k"), e.scope, "k", store.StatusRetryable, 2)

	third := e.execute("k", "fp")
	if third.Attempt != 3 {
		t.Fatalf("third attempt = %d, want 3", third.Attempt)
	}

	// The count lives as long as keep says.
	e.release(third, time.Minute)
	e.advance(2 * time.Minute)
	e.getNotFound("k")
	if l := e.execute("k", "fp"); l.Attempt != 1 || l.Token <= third.Token {
		t.Fatalf("ClaimLease after the count expired = attempt %d token %d; want attempt 1, a token above %d", l.Attempt, l.Token, third.Token)
	}

	// keep <= 0 keeps nothing.
	l := e.execute("zero", "")
	e.release(l, 0)
	e.getNotFound("zero")
	if l := e.execute("zero", ""); l.Attempt != 1 {
		t.Fatalf("ClaimLease after Release(keep 0) = attempt %d, want 1", l.Attempt)
	}
}

func testReleaseStaleLease(t *testing.T, e *env) {
	stale := e.execute("k", "")
	e.advance(lease + time.Second)
	fresh := e.execute("k", "")
	e.leaseLost("Release of a taken-over lease", e.s.Release(e.ctx, stale, retryable(ttl)))
	if rec := e.get("k"); rec.Status != store.StatusInProgress || rec.Token != fresh.Token {
		t.Fatalf("record = %v token %d, want in_progress token %d", rec.Status, rec.Token, fresh.Token)
	}

	e.release(fresh, ttl)
	e.leaseLost("second Release", e.s.Release(e.ctx, fresh, retryable(ttl)))
}

func testRetryAfterHoldsTheNextAttemptBack(t *testing.T, e *env) {
	first := e.execute("k", "fp")
	e.releaseAs(first, store.Completion{Status: store.StatusRetryable, TTL: ttl, RetryAfter: time.Minute})
	rec := e.get("k")
	checkRecord(t, rec, e.scope, "k", store.StatusRetryable, 1)
	if d := rec.RetryAt.Sub(rec.UpdatedAt); d < time.Minute-time.Second || d > time.Minute+time.Second {
		t.Fatalf("record RetryAt = UpdatedAt + %v, want a minute", d)
	}

	// Claims before the time are held back, and are not attempts.
	for range 2 {
		res := e.expect(store.DecisionHeld, "k", "fp", lease)
		if res.RetryIn < time.Minute-5*time.Second || res.RetryIn > time.Minute {
			t.Fatalf("held-back claim's RetryIn = %v, want just under a minute", res.RetryIn)
		}
		if res.Record == nil || res.Record.Status != store.StatusRetryable || res.Record.Token != first.Token {
			t.Fatalf("held-back claim's record = %+v, want the retryable record of token %d", res.Record, first.Token)
		}
	}
	checkRecord(t, e.get("k"), e.scope, "k", store.StatusRetryable, 1)

	e.advance(30 * time.Second)
	if res := e.expect(store.DecisionHeld, "k", "fp", lease); res.RetryIn > 30*time.Second+time.Second {
		t.Fatalf("RetryIn 30 s later = %v, want at most 30 s", res.RetryIn)
	}
	e.advance(31 * time.Second)
	second := e.execute("k", "fp")
	if second.Attempt != 2 || second.Token <= first.Token {
		t.Fatalf("claim after the pause = attempt %d token %d; want attempt 2 above token %d", second.Attempt, second.Token, first.Token)
	}

	// A release without a pause holds nothing back.
	e.release(second, ttl)
	if rec := e.get("k"); !rec.RetryAt.IsZero() {
		t.Fatalf("record RetryAt = %v after a release without a pause, want zero", rec.RetryAt)
	}
	if l := e.execute("k", "fp"); l.Attempt != 3 {
		t.Fatalf("third claim = attempt %d, want 3", l.Attempt)
	}

	// What cannot be a release is refused, and leaves the lease as it was.
	l := e.execute("bad", "")
	for _, out := range []store.Completion{
		{Status: store.StatusSucceeded, TTL: ttl},
		{Status: 0, TTL: ttl},
		{Status: store.StatusRetryable, TTL: ttl, RetryAfter: -time.Second},
		{Status: store.StatusRetryable, TTL: time.Second, RetryAfter: time.Minute},
	} {
		e.invalid(fmt.Sprintf("Release with status %v, TTL %v, RetryAfter %v", out.Status, out.TTL, out.RetryAfter), e.s.Release(e.ctx, l, out))
	}
	if rec := e.get("bad"); rec.Status != store.StatusInProgress || rec.Token != l.Token {
		t.Fatalf("record = %v token %d, want in_progress token %d", rec.Status, rec.Token, l.Token)
	}
}

func testUncountedReleaseKeepsTheCount(t *testing.T, e *env) {
	first := e.execute("k", "")
	e.release(first, ttl)
	second := e.execute("k", "")
	e.releaseAs(second, store.Completion{Status: store.StatusRetryable, TTL: ttl, RetryAfter: time.Minute, Uncounted: true})
	checkRecord(t, e.get("k"), e.scope, "k", store.StatusRetryable, 1)
	e.expect(store.DecisionHeld, "k", "", lease)
	e.advance(time.Minute + time.Second)
	if l := e.execute("k", ""); l.Attempt != 2 || l.Token <= second.Token {
		t.Fatalf("claim after an uncounted release = attempt %d token %d; want attempt 2 again, above token %d", l.Attempt, l.Token, second.Token)
	}

	// The first attempt given back leaves a count of none.
	l := e.execute("new", "")
	e.releaseAs(l, store.Completion{Status: store.StatusRetryable, TTL: ttl, Uncounted: true})
	checkRecord(t, e.get("new"), e.scope, "new", store.StatusRetryable, 0)
	if l := e.execute("new", ""); l.Attempt != 1 {
		t.Fatalf("claim after the first attempt was given back = attempt %d, want 1", l.Attempt)
	}
}

func testDelete(t *testing.T, e *env) {
	l := e.execute("k", "fp")
	e.complete(l, success([]byte("r")))
	e.remove("k")
	e.getNotFound("k")
	if l := e.execute("k", "other-fp"); l.Attempt != 1 {
		t.Fatalf("ClaimLease after Delete = attempt %d, want 1", l.Attempt)
	}

	if err := e.s.Delete(e.ctx, e.scope, "absent", l.Token); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Delete of an absent key = %v, want ErrNotFound", err)
	}
}

// remove deletes key's record under the token Get reads, as an operator
// does.
func (e *env) remove(key string) {
	e.t.Helper()
	rec := e.get(key)
	if err := e.s.Delete(e.ctx, e.scope, key, rec.Token); err != nil {
		e.t.Fatalf("Delete(%q, token %d): %v", key, rec.Token, err)
	}
}

// Delete removes a record only under the token it was read with.
func testDeleteUnderTheReadToken(t *testing.T, e *env) {
	first := e.execute("k", "")
	e.advance(lease + time.Second) // the first worker hangs; a redelivery takes over
	second := e.expect(store.DecisionExecute, "k", "", lease).Claim

	if err := e.s.Delete(e.ctx, e.scope, "k", first.Token); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Delete with the token before the takeover = %v, want ErrLeaseLost", err)
	}
	if rec := e.get("k"); rec.Token != second.Token {
		t.Fatalf("a refused Delete changed the record: token %d, want %d", rec.Token, second.Token)
	}
	if err := e.s.Delete(e.ctx, e.scope, "k", second.Token); err != nil {
		t.Fatalf("Delete with the current token: %v", err)
	}
	e.getNotFound("k")
	e.leaseLost("Complete after the record was deleted", e.s.Complete(e.ctx, second, success(nil)))
	if err := e.s.Delete(e.ctx, e.scope, "k", second.Token); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Delete of a deleted record = %v, want ErrNotFound", err)
	}
}

// expiring writes records of every kind, some to expire within two minutes
// (finished, crashed leases, released keys), some to live an hour, and
// returns their keys.
func (e *env) expiring() (expired, inProgress, live []string) {
	short := store.Completion{Status: store.StatusSucceeded, Result: []byte("r"), TTL: time.Minute}
	long := store.Completion{Status: store.StatusSucceeded, Result: []byte("r"), TTL: time.Hour}
	for i := range 7 {
		key := fmt.Sprintf("short-%d", i)
		e.complete(e.execute(key, ""), short)
		expired = append(expired, key)
	}
	for i := range 3 { // crashed workers: leases that run out
		key := fmt.Sprintf("crashed-%d", i)
		e.expect(store.DecisionExecute, key, "", time.Minute)
		expired = append(expired, key)
		inProgress = append(inProgress, key)
	}
	for i := range 2 {
		key := fmt.Sprintf("released-%d", i)
		e.release(e.execute(key, ""), time.Minute)
		expired = append(expired, key)
	}
	for i := range 4 {
		key := fmt.Sprintf("long-%d", i)
		e.complete(e.execute(key, ""), long)
		live = append(live, key)
	}
	e.expect(store.DecisionExecute, "long-lease", "", time.Hour)
	e.release(e.execute("long-release", ""), time.Hour)
	live = append(live, "long-lease", "long-release")
	return expired, inProgress, live
}

// expiredAreGone checks that the live records are there and the expired
// ones are removed, not just hidden: an expired lease that was still there
// would be taken over with attempt 2.
func (e *env) expiredAreGone(expired, inProgress, live []string) {
	e.t.Helper()
	for _, key := range live {
		e.get(key)
	}
	for _, key := range expired {
		e.getNotFound(key)
	}
	for _, key := range inProgress {
		res := e.expect(store.DecisionExecute, key, "", lease)
		if res.Takeover || res.Claim.Attempt != 1 {
			e.t.Errorf("%s: ClaimLease after the record expired = takeover %v attempt %d; want a fresh attempt 1", key, res.Takeover, res.Claim.Attempt)
		}
	}
}

// DeleteExpired (a store that has it) removes expired records in batches of
// at most its limit, expired leases included, and keeps the live ones.
func testDeleteExpired(t *testing.T, e *env) {
	x, ok := e.s.(expirer)
	if !ok {
		t.Skip("storetest: the store has no DeleteExpired")
	}
	const limit = 5

	// A shared store may hold expired records of other subtests (Advance
	// moves all of them): clear them first so the counts below are ours.
	for i := 0; ; i++ {
		n, err := x.DeleteExpired(e.ctx, 1000)
		if err != nil {
			t.Fatalf("DeleteExpired: %v", err)
		}
		if n == 0 {
			break
		}
		if i == 1000 {
			t.Fatal("DeleteExpired never ran out of expired records")
		}
	}

	expired, inProgress, live := e.expiring()

	if n, err := x.DeleteExpired(e.ctx, limit); err != nil || n != 0 {
		t.Fatalf("DeleteExpired with nothing expired = %d, %v; want 0", n, err)
	}

	e.advance(2 * time.Minute)

	total := 0
	for i := 0; !e.native; i++ {
		n, err := x.DeleteExpired(e.ctx, limit)
		if err != nil {
			t.Fatalf("DeleteExpired: %v", err)
		}
		if n > limit {
			t.Fatalf("DeleteExpired(limit %d) removed %d", limit, n)
		}
		if i == 0 && n != limit {
			t.Fatalf("first DeleteExpired(limit %d) removed %d of %d expired records", limit, n, len(expired))
		}
		total += n
		if n == 0 {
			break
		}
		if i == 100 {
			t.Fatal("DeleteExpired never ran out of expired records")
		}
	}
	switch {
	case e.native:
		if n, err := x.DeleteExpired(e.ctx, limit); err != nil || n != 0 {
			t.Fatalf("DeleteExpired of a store that frees its records itself = %d, %v; want 0", n, err)
		}
	case total < len(expired):
		t.Fatalf("DeleteExpired removed %d records in total, want %d", total, len(expired))
	}
	e.expiredAreGone(expired, inProgress, live)

	_, err := x.DeleteExpired(e.ctx, 0)
	e.invalid("DeleteExpired with limit 0", err)
}

// A store with Harness.NativeExpiry removes expired records by itself,
// expired leases included once their Retain has passed.
func testNativeExpiry(t *testing.T, e *env) {
	if !e.native {
		t.Skip("storetest: the store does not free expired records by itself (Harness.NativeExpiry)")
	}
	expired, inProgress, live := e.expiring()
	e.advance(2 * time.Minute)
	e.expiredAreGone(expired, inProgress, live)
}

// A worker that crashes holding a lease leaves the attempt count behind for
// the claim's Retain: cleanup (DeleteExpired when the store has it, else
// its own expiry) does not reset it, so a message that crashes every worker
// still reaches the attempt cap.
func testAttemptsSurviveCleanupForRetain(t *testing.T, e *env) {
	req := e.req("crashed", "fp", lease)
	req.Retain = 30 * time.Minute
	res, err := e.s.ClaimLease(e.ctx, req)
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease = %v, %v", res.Decision, err)
	}
	e.advance(2 * time.Minute) // the lease ran out; the worker is gone
	if x, ok := e.s.(expirer); ok {
		for {
			n, err := x.DeleteExpired(e.ctx, 1000)
			if err != nil {
				t.Fatalf("DeleteExpired: %v", err)
			}
			if n == 0 {
				break
			}
		}
	}
	again, err := e.s.ClaimLease(e.ctx, req)
	if err != nil || again.Decision != store.DecisionExecute || again.Claim.Attempt != 2 || !again.Takeover {
		t.Fatalf("ClaimLease after cleanup = %v attempt %d takeover %v, %v; want a takeover at attempt 2", again.Decision, again.Claim.Attempt, again.Takeover, err)
	}
}

func testInvalidRequests(t *testing.T, e *env) {
	_, err := e.s.ClaimLease(e.ctx, e.req("", "fp", lease))
	e.invalid("ClaimLease with an empty key", err)
	for _, d := range []time.Duration{0, -time.Second} {
		_, err = e.s.ClaimLease(e.ctx, e.req("k", "fp", d))
		e.invalid(fmt.Sprintf("ClaimLease with lease %v", d), err)
	}
	e.getNotFound("k")

	l := e.execute("k", "")
	for _, out := range []store.Completion{
		{Status: store.StatusInProgress, TTL: ttl},
		{Status: store.StatusRetryable, TTL: ttl},
		{Status: 0, TTL: ttl},
		{Status: store.StatusSucceeded, TTL: 0},
		{Status: store.StatusCachedFailure, TTL: -time.Second},
	} {
		e.invalid(fmt.Sprintf("Complete with status %v, TTL %v", out.Status, out.TTL), e.s.Complete(e.ctx, l, out))
	}
	for _, d := range []time.Duration{0, -time.Second} {
		_, err = e.s.Extend(e.ctx, l, d)
		e.invalid(fmt.Sprintf("Extend by %v", d), err)
	}
	// Nothing of the above touched the lease.
	if rec := e.get("k"); rec.Status != store.StatusInProgress || rec.Token != l.Token {
		t.Fatalf("record = %v token %d, want in_progress token %d", rec.Status, rec.Token, l.Token)
	}
	e.complete(l, success(nil))
}

func testScopesIsolate(t *testing.T, e *env) {
	other := e.scope + "/other"
	a := e.execute("k", "a")
	res, err := e.s.ClaimLease(e.ctx, store.LeaseRequest{Scope: other, Key: "k", Fingerprint: "b", LeaseDuration: lease})
	if err != nil {
		t.Fatalf("ClaimLease in the other scope: %v", err)
	}
	if res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease of the same key in another scope = %v, want execute", res.Decision)
	}
	b := res.Claim
	if b.Scope != other || b.Attempt != 1 {
		t.Errorf("other scope's lease = (%q, attempt %d), want (%q, attempt 1)", b.Scope, b.Attempt, other)
	}

	e.complete(a, success([]byte("a")))
	rec, err := e.s.Get(e.ctx, other, "k")
	if err != nil {
		t.Fatalf("Get in the other scope: %v", err)
	}
	if rec.Status != store.StatusInProgress || rec.Fingerprint != "b" {
		t.Errorf("other scope's record = %v fp %q, want in_progress fp %q", rec.Status, rec.Fingerprint, "b")
	}

	if err := e.s.Delete(e.ctx, other, "k", b.Token); err != nil {
		t.Fatalf("Delete in the other scope: %v", err)
	}
	if rec := e.get("k"); string(rec.Result) != "a" {
		t.Errorf("Delete in another scope removed this scope's record")
	}
}

func testConcurrentStress(t *testing.T, e *env) {
	storeload.Run(t, e.s, e.scope, 300)
}

func testTokensIncrease(t *testing.T, e *env) {
	var tokens []int64
	take := func(l store.Claim) store.Claim {
		t.Helper()
		if n := len(tokens); n > 0 && l.Token <= tokens[n-1] {
			t.Fatalf("token %d after %v does not rise", l.Token, tokens)
		}
		tokens = append(tokens, l.Token)
		return l
	}

	l := take(e.execute("k", ""))
	e.release(l, ttl)
	l = take(e.execute("k", "")) // retry after Release
	e.advance(lease + time.Second)
	stale := take(e.execute("k", "")) // takeover

	e.remove("k")
	fresh := take(e.execute("k", "")) // after Delete
	if fresh.Attempt != 1 {
		t.Errorf("attempt after Delete = %d, want 1", fresh.Attempt)
	}

	// The worker from before the Delete cannot finish the new attempt, even
	// though its lease is not expired by its own reckoning.
	e.leaseLost("Complete by the worker from before Delete", e.s.Complete(e.ctx, stale, success([]byte("stale"))))
	e.leaseLost("Release by the worker from before Delete", e.s.Release(e.ctx, stale, retryable(ttl)))
	_, err := e.s.Extend(e.ctx, stale, lease)
	e.leaseLost("Extend by the worker from before Delete", err)
	if rec := e.get("k"); rec.Status != store.StatusInProgress || rec.Token != fresh.Token {
		t.Fatalf("record = %v token %d, want in_progress token %d", rec.Status, rec.Token, fresh.Token)
	}

	e.complete(fresh, store.Completion{Status: store.StatusSucceeded, TTL: time.Minute})
	e.advance(2 * time.Minute)
	take(e.execute("k", "")) // after expiry
}

func testKeyLimit(t *testing.T, e *env) {
	limit := e.s.Limits().MaxKeyLen
	if limit == 0 { // no bound: a long key is held whole
		long := strings.Repeat("k", 10_000)
		e.complete(e.execute(long, ""), success([]byte("r")))
		if rec := e.get(long); rec.Key != long {
			t.Fatalf("record key is %d bytes, want %d", len(rec.Key), len(long))
		}
		return
	}
	longest := strings.Repeat("k", limit)
	l := e.execute(longest, "")
	e.complete(l, success([]byte("r")))
	if rec := e.get(longest); rec.Key != longest {
		t.Fatalf("record key is %d bytes, want %d", len(rec.Key), limit)
	}

	_, err := e.s.ClaimLease(e.ctx, e.req(longest+"k", "", lease))
	e.invalid(fmt.Sprintf("ClaimLease with a key of %d bytes (MaxKeyLen %d)", limit+1, limit), err)
}

// List selects by scope, status and age, pages in (scope, key) order until
// Next is empty, and refuses a cursor it did not make.
func testListFiltersAndPages(t *testing.T, e *env) {
	for _, k := range []string{"c", "a", "e", "b", "d"} {
		e.complete(e.execute(k, ""), success([]byte(k)))
	}
	held := e.execute("f", "") // in progress
	before := e.get("f").UpdatedAt.Add(time.Millisecond)
	other := *e
	other.scope = e.scope + "-other"
	other.complete(other.execute("a", ""), success(nil))

	list := func(req store.ListRequest) []string {
		t.Helper()
		var keys []string
		for pages := 0; ; pages++ {
			page, err := e.s.List(e.ctx, req)
			if err != nil {
				t.Fatalf("List(%+v): %v", req, err)
			}
			if req.Limit > 0 && len(page.Records) > req.Limit {
				t.Fatalf("List(%+v) gave %d records, more than its limit", req, len(page.Records))
			}
			for _, r := range page.Records {
				keys = append(keys, r.Scope+"/"+r.Key+"/"+r.Status.String())
			}
			if page.Next == "" {
				return keys
			}
			if pages > 10 {
				t.Fatalf("List(%+v) did not end after 10 pages", req)
			}
			req.After = page.Next
		}
	}
	s := e.scope
	want := func(got []string, want ...string) {
		t.Helper()
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Fatalf("List gave %v, want %v", got, want)
		}
	}
	want(list(store.ListRequest{Scope: s, Limit: 2}),
		s+"/a/succeeded", s+"/b/succeeded", s+"/c/succeeded", s+"/d/succeeded", s+"/e/succeeded", s+"/f/in_progress")
	want(list(store.ListRequest{Scope: s, Status: store.StatusInProgress}), s+"/f/in_progress")
	want(list(store.ListRequest{Scope: other.scope}), other.scope+"/a/succeeded")
	if got := list(store.ListRequest{Scope: s, UpdatedBefore: before}); len(got) != 6 {
		t.Fatalf("List updated before now gave %v, want all 6", got)
	}
	if got := list(store.ListRequest{Scope: s, UpdatedBefore: time.Unix(0, 0)}); len(got) != 0 {
		t.Fatalf("List updated before 1970 gave %v, want none", got)
	}
	e.complete(held, success(nil))

	_, err := e.s.List(e.ctx, store.ListRequest{Scope: s, After: "not a cursor!"})
	e.invalid("List with a cursor it did not make", err)
	_, err = e.s.List(e.ctx, store.ListRequest{Limit: -1})
	e.invalid("List with a negative limit", err)
}
