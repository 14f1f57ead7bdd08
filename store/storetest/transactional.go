package storetest

import (
	"errors"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
)

// runTransactional runs the contract of the one-transaction mode
// (store.Transactional) as subtests of t, calling newEnv once per subtest
// for a store that is a store.Transactional.
func runTransactional(t *testing.T, newEnv func(t *testing.T) *env) {
	t.Helper()
	tests := []struct {
		name string
		run  func(t *testing.T, e *txEnv)
	}{
		{"CommitThenReplay", testTxCommitThenReplay},
		{"RollbackLeavesTheKeyFree", testTxRollbackLeavesTheKeyFree},
		{"RetryableRecordCarriesTheAttempt", testTxRetryableRecordCarriesTheAttempt},
		{"RetryAfterHoldsTheNextClaimBack", testTxRetryAfterHoldsTheNextClaimBack},
		{"CachedFailureReplays", testTxCachedFailureReplays},
		{"RecordNeverOverwritesANewerClaim", testTxRecordNeverOverwritesANewerClaim},
		{"ConcurrentClaimWaitsThenReplays", testTxConcurrentClaimWaitsThenReplays},
		{"ConcurrentClaimTakesTheKeyAfterARollback", testTxConcurrentClaimTakesTheKeyAfterARollback},
		{"WaitIsBounded", testTxWaitIsBounded},
		{"Mismatch", testTxMismatch},
		{"ExpiredSuccessFreesTheKey", testTxExpiredSuccessFreesTheKey},
		{"TokensRise", testTxTokensRise},
		{"InvalidRequests", testTxInvalidRequests},
		{"MessageUUID", testTxMessageUUID},
		{"DeferredClaimOfANewKeyCommits", testTxDeferredClaimOfANewKeyCommits},
		{"DeferredClaimOfARecordedKeyIsLost", testTxDeferredClaimOfARecordedKeyIsLost},
		{"DeferredClaimOfAHeldKeyIsLost", testTxDeferredClaimOfAHeldKeyIsLost},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			tx, ok := e.s.(store.Transactional)
			if !ok {
				t.Fatal("storetest: the harness gave a store.Transactional once and another store now")
			}
			tt.run(t, &txEnv{env: e, tx: tx})
		})
	}
}

// txEnv is a subtest's env with the store's one-transaction mode.
type txEnv struct {
	*env
	tx store.Transactional
}

func (e *txEnv) req(key, fp string) store.TxRequest {
	return store.TxRequest{Scope: e.scope, Key: key, Fingerprint: fp, SuccessTTL: ttl, Wait: 10 * time.Second}
}

// claim claims key and checks the decision.
func (e *txEnv) claim(want store.Decision, key, fp string) store.TxResult {
	e.t.Helper()
	res, err := e.tx.ClaimInTx(e.ctx, e.req(key, fp))
	if err != nil {
		e.t.Fatalf("Claim(%q): %v", key, err)
	}
	if res.Decision != want {
		e.t.Fatalf("Claim(%q) = %v, want %v (record %+v)", key, res.Decision, want, res.Record)
	}
	if (res.Tx != nil) != (want == store.DecisionExecute) {
		e.t.Fatalf("Claim(%q) = %v with transaction %v: only Execute holds one", key, res.Decision, res.Tx)
	}
	return res
}

func (e *txEnv) commit(res store.TxResult, result []byte) {
	e.t.Helper()
	if err := res.Tx.Commit(e.ctx, result); err != nil {
		e.t.Fatalf("Commit: %v", err)
	}
}

func (e *txEnv) rollback(res store.TxResult) {
	e.t.Helper()
	if err := res.Tx.Rollback(e.ctx); err != nil {
		e.t.Fatalf("Rollback: %v", err)
	}
}

func (e *txEnv) record(l store.Claim, out store.Completion) error {
	return e.tx.RecordRollback(e.ctx, l, "fp", out)
}

func testTxCommitThenReplay(t *testing.T, e *txEnv) {
	first := e.claim(store.DecisionExecute, "k", "fp")
	if first.Claim.Attempt != 1 || first.Claim.Token == 0 || first.Takeover {
		t.Fatalf("first claim's lease = %+v, takeover %v; want attempt 1 with a token", first.Claim, first.Takeover)
	}
	// Until the commit, nobody sees the record.
	if _, err := e.s.Get(e.ctx, e.scope, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get before the commit = %v, want ErrNotFound", err)
	}
	e.commit(first, []byte("result"))
	dup := e.claim(store.DecisionReplay, "k", "fp")
	if rec := dup.Record; rec.Status != store.StatusSucceeded || string(rec.Result) != "result" || rec.Token != first.Claim.Token {
		t.Fatalf("replayed record = %+v, want the committed success", rec)
	}
	// A commit without a result stores none.
	e.commit(e.claim(store.DecisionExecute, "empty", "fp"), nil)
	if rec := e.claim(store.DecisionReplay, "empty", "fp").Record; rec.Status != store.StatusSucceeded || len(rec.Result) != 0 {
		t.Fatalf("replayed record = %+v, want a success without a result", rec)
	}
}

func testTxRollbackLeavesTheKeyFree(t *testing.T, e *txEnv) {
	e.rollback(e.claim(store.DecisionExecute, "k", "fp"))
	if again := e.claim(store.DecisionExecute, "k", "fp"); again.Claim.Attempt != 1 {
		t.Fatalf("after a rollback with nothing recorded: attempt %d, want 1", again.Claim.Attempt)
	} else {
		e.rollback(again)
	}
	if _, err := e.s.Get(e.ctx, e.scope, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get after rollbacks = %v, want ErrNotFound", err)
	}
}

func testTxRetryableRecordCarriesTheAttempt(t *testing.T, e *txEnv) {
	first := e.claim(store.DecisionExecute, "k", "fp")
	e.rollback(first)
	if err := e.record(first.Claim, retryable(ttl)); err != nil {
		t.Fatal(err)
	}
	rec, err := e.s.Get(e.ctx, e.scope, "k")
	if err != nil || rec.Status != store.StatusRetryable || rec.Attempt != 1 {
		t.Fatalf("record = %+v, %v; want retryable at attempt 1", rec, err)
	}
	second := e.claim(store.DecisionExecute, "k", "fp")
	if second.Claim.Attempt != 2 || second.Takeover {
		t.Fatalf("the next claim = attempt %d takeover %v, want attempt 2 without takeover", second.Claim.Attempt, second.Takeover)
	}
	e.commit(second, nil)
	if rec, err := e.s.Get(e.ctx, e.scope, "k"); err != nil || rec.Status != store.StatusSucceeded || rec.Attempt != 2 {
		t.Fatalf("record = %+v, %v; want succeeded at attempt 2", rec, err)
	}
}

func testTxRetryAfterHoldsTheNextClaimBack(t *testing.T, e *txEnv) {
	first := e.claim(store.DecisionExecute, "k", "fp")
	e.rollback(first)
	if err := e.record(first.Claim, store.Completion{Status: store.StatusRetryable, TTL: ttl, RetryAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
	held := e.claim(store.DecisionHeld, "k", "fp")
	if held.RetryIn < time.Minute-5*time.Second || held.RetryIn > time.Minute || held.Contended {
		t.Fatalf("held-back claim = RetryIn %v contended %v; want just under a minute, not contended", held.RetryIn, held.Contended)
	}
	if rec := held.Record; rec == nil || rec.Status != store.StatusRetryable || rec.Attempt != 1 {
		t.Fatalf("held-back claim's record = %+v, want retryable at attempt 1", rec)
	}
	e.advance(time.Minute + time.Second)
	second := e.claim(store.DecisionExecute, "k", "fp")
	if second.Claim.Attempt != 2 {
		t.Fatalf("claim after the pause = attempt %d, want 2", second.Claim.Attempt)
	}

	// An uncounted rollback gives the attempt back.
	e.rollback(second)
	if err := e.record(second.Claim, store.Completion{Status: store.StatusRetryable, TTL: ttl, RetryAfter: time.Minute, Uncounted: true}); err != nil {
		t.Fatal(err)
	}
	if rec, err := e.s.Get(e.ctx, e.scope, "k"); err != nil || rec.Attempt != 1 || rec.RetryAt.IsZero() {
		t.Fatalf("record = %+v, %v; want retryable at attempt 1, held back", rec, err)
	}
	e.claim(store.DecisionHeld, "k", "fp")
	e.advance(time.Minute + time.Second)
	if third := e.claim(store.DecisionExecute, "k", "fp"); third.Claim.Attempt != 2 {
		t.Fatalf("claim after an uncounted rollback = attempt %d, want 2", third.Claim.Attempt)
	} else {
		e.rollback(third)
	}
}

func testTxCachedFailureReplays(t *testing.T, e *txEnv) {
	first := e.claim(store.DecisionExecute, "k", "fp")
	e.rollback(first)
	if err := e.record(first.Claim, store.Completion{Status: store.StatusCachedFailure, ErrorKind: store.ErrorKindCached, ErrorMessage: "no such account", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	rec := e.claim(store.DecisionReplay, "k", "fp").Record
	if rec.Status != store.StatusCachedFailure || rec.ErrorKind != store.ErrorKindCached || rec.ErrorMessage != "no such account" {
		t.Fatalf("replayed record = %+v, want the cached failure", rec)
	}
}

func testTxRecordNeverOverwritesANewerClaim(t *testing.T, e *txEnv) {
	stale := e.claim(store.DecisionExecute, "k", "fp")
	e.rollback(stale)
	newer := e.claim(store.DecisionExecute, "k", "fp")
	// While the newer claim is open, recording the stale one neither waits
	// for it nor writes.
	if err := e.record(stale.Claim, retryable(ttl)); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("recording a claim while a newer one is open = %v, want ErrLeaseLost at once", err)
	}
	e.commit(newer, []byte("newer"))
	for _, out := range []store.Completion{retryable(ttl), {Status: store.StatusCachedFailure, ErrorKind: store.ErrorKindCached, TTL: ttl}} {
		if err := e.record(stale.Claim, out); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("recording %v for a claim that a newer one succeeded = %v, want ErrLeaseLost", out.Status, err)
		}
	}
	if rec := e.claim(store.DecisionReplay, "k", "fp").Record; string(rec.Result) != "newer" {
		t.Fatalf("record = %+v, want the newer success", rec)
	}
}

// runClaim claims key in the background.
func (e *txEnv) runClaim(key string, wait time.Duration) <-chan store.TxResult {
	out := make(chan store.TxResult, 1)
	req := e.req(key, "fp")
	req.Wait = wait
	go func() {
		res, err := e.tx.ClaimInTx(e.ctx, req)
		if err != nil {
			e.t.Errorf("concurrent Claim: %v", err)
		}
		out <- res
	}()
	return out
}

func testTxConcurrentClaimWaitsThenReplays(t *testing.T, e *txEnv) {
	first := e.claim(store.DecisionExecute, "k", "fp")
	second := e.runClaim("k", time.Minute)
	time.Sleep(50 * time.Millisecond) // let it meet the claim (it replays either way)
	e.commit(first, []byte("first"))
	res := <-second
	if res.Decision != store.DecisionReplay || string(res.Record.Result) != "first" {
		t.Fatalf("the concurrent claim = %v (record %+v), want a replay of the first", res.Decision, res.Record)
	}
}

func testTxConcurrentClaimTakesTheKeyAfterARollback(t *testing.T, e *txEnv) {
	first := e.claim(store.DecisionExecute, "k", "fp")
	second := e.runClaim("k", time.Minute)
	time.Sleep(50 * time.Millisecond) // let it meet the claim (it executes either way)
	e.rollback(first)
	res := <-second
	if res.Decision != store.DecisionExecute {
		t.Fatalf("the concurrent claim = %v, want Execute after the first rolled back", res.Decision)
	}
	e.commit(res, nil)
}

func testTxWaitIsBounded(t *testing.T, e *txEnv) {
	first := e.claim(store.DecisionExecute, "k", "fp")
	res := <-e.runClaim("k", 100*time.Millisecond)
	if res.Decision != store.DecisionHeld || !res.Contended || res.Tx != nil {
		t.Fatalf("a claim past its wait = %v contended %v, want InProgress, contended, no transaction", res.Decision, res.Contended)
	}
	e.commit(first, nil)
	e.claim(store.DecisionReplay, "k", "fp")
}

func testTxMismatch(t *testing.T, e *txEnv) {
	e.commit(e.claim(store.DecisionExecute, "k", "fp-a"), nil)
	if rec := e.claim(store.DecisionMismatch, "k", "fp-b").Record; rec.Fingerprint != "fp-a" {
		t.Fatalf("mismatch record = %+v, want the stored fingerprint", rec)
	}
	e.claim(store.DecisionReplay, "k", "") // an empty fingerprint never mismatches
}

func testTxExpiredSuccessFreesTheKey(t *testing.T, e *txEnv) {
	e.commit(e.claim(store.DecisionExecute, "k", "fp"), nil)
	e.advance(ttl + time.Minute)
	if _, err := e.s.Get(e.ctx, e.scope, "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get of an expired success = %v, want ErrNotFound", err)
	}
	if res := e.claim(store.DecisionExecute, "k", "fp"); res.Claim.Attempt != 1 {
		t.Fatalf("claim of an expired success = attempt %d, want a fresh attempt 1", res.Claim.Attempt)
	} else {
		e.rollback(res)
	}
}

func testTxTokensRise(t *testing.T, e *txEnv) {
	var last int64
	for i := range 3 {
		res := e.claim(store.DecisionExecute, "k", "fp")
		if res.Claim.Token <= last {
			t.Fatalf("claim %d: token %d, not above the previous %d", i+1, res.Claim.Token, last)
		}
		last = res.Claim.Token
		e.rollback(res)
		if err := e.record(res.Claim, retryable(ttl)); err != nil {
			t.Fatal(err)
		}
	}
}

func testTxInvalidRequests(t *testing.T, e *txEnv) {
	for name, req := range map[string]store.TxRequest{
		"empty key":       {Scope: e.scope, SuccessTTL: ttl, Wait: time.Second},
		"no success TTL":  {Scope: e.scope, Key: "k", Wait: time.Second},
		"no wait":         {Scope: e.scope, Key: "k", SuccessTTL: ttl},
		"negative retain": {Scope: e.scope, Key: "k", SuccessTTL: ttl, Wait: time.Second, Retain: -time.Second},
	} {
		if _, err := e.tx.ClaimInTx(e.ctx, req); !errors.Is(err, store.ErrInvalidRequest) {
			t.Errorf("Claim with %s = %v, want ErrInvalidRequest", name, err)
		}
	}
	l := store.Claim{Scope: e.scope, Key: "k", Token: 1, Attempt: 1}
	for name, out := range map[string]store.Completion{
		"a success":   {Status: store.StatusSucceeded, TTL: ttl},
		"no TTL":      {Status: store.StatusRetryable},
		"no status":   {TTL: ttl},
		"in progress": {Status: store.StatusInProgress, TTL: ttl},
	} {
		if err := e.record(l, out); !errors.Is(err, store.ErrInvalidRequest) {
			t.Errorf("RecordRollback of %s = %v, want ErrInvalidRequest", name, err)
		}
	}
}

// deferred claims key with TxRequest.Deferrable. A store may decide up
// front anyway; either way the answer is Execute for a new key.
func (e *txEnv) deferred(key string) store.TxResult {
	e.t.Helper()
	req := e.req(key, "fp")
	req.Deferrable = true
	res, err := e.tx.ClaimInTx(e.ctx, req)
	if err != nil {
		e.t.Fatalf("deferred Claim(%q): %v", key, err)
	}
	return res
}

// lost checks that a deferred claim of a key held or recorded elsewhere
// either was decided up front (no transaction) or ends, by end, in an
// error wrapping ErrLeaseLost.
func (e *txEnv) lost(res store.TxResult, end func(store.Tx) error) {
	e.t.Helper()
	if res.Decision != store.DecisionExecute {
		return // decided up front
	}
	if err := end(res.Tx); !errors.Is(err, store.ErrLeaseLost) {
		e.t.Fatalf("ending a deferred claim of a key another delivery holds or recorded = %v, want ErrLeaseLost", err)
	}
}

func testTxDeferredClaimOfANewKeyCommits(t *testing.T, e *txEnv) {
	res := e.deferred("k")
	if res.Decision != store.DecisionExecute || res.Tx == nil || res.Claim.Attempt != 1 || res.Claim.Token == 0 {
		t.Fatalf("deferred claim of a new key = %v %+v, want Execute at attempt 1 with a token and a transaction", res.Decision, res.Claim)
	}
	e.commit(res, []byte("result"))
	if rec := e.claim(store.DecisionReplay, "k", "fp").Record; rec.Status != store.StatusSucceeded || string(rec.Result) != "result" || rec.Token != res.Claim.Token {
		t.Fatalf("replayed record = %+v, want the deferred claim's success with its token %d", rec, res.Claim.Token)
	}
	// A rollback of a deferred claim that took the key leaves it free.
	e.rollback(e.deferred("free"))
	e.rollback(e.claim(store.DecisionExecute, "free", "fp"))
}

func testTxDeferredClaimOfARecordedKeyIsLost(t *testing.T, e *txEnv) {
	e.commit(e.claim(store.DecisionExecute, "k", "fp"), []byte("first"))
	e.lost(e.deferred("k"), func(tx store.Tx) error { return tx.Commit(e.ctx, []byte("second")) })
	e.lost(e.deferred("k"), func(tx store.Tx) error { return tx.Rollback(e.ctx) })
	if rec := e.claim(store.DecisionReplay, "k", "fp").Record; string(rec.Result) != "first" {
		t.Fatalf("record after lost deferred claims = %+v, want the first success", rec)
	}
	// A cached failure, and a retryable record, are recorded keys too: the
	// claim decided up front carries the attempt on.
	failed := e.claim(store.DecisionExecute, "f", "fp")
	e.rollback(failed)
	if err := e.record(failed.Claim, retryable(ttl)); err != nil {
		t.Fatal(err)
	}
	e.lost(e.deferred("f"), func(tx store.Tx) error { return tx.Commit(e.ctx, nil) })
	if again := e.claim(store.DecisionExecute, "f", "fp"); again.Claim.Attempt != 2 {
		t.Fatalf("claim after a lost deferred claim = attempt %d, want 2", again.Claim.Attempt)
	} else {
		e.rollback(again)
	}
}

func testTxDeferredClaimOfAHeldKeyIsLost(t *testing.T, e *txEnv) {
	held := e.claim(store.DecisionExecute, "k", "fp")
	e.lost(e.deferred("k"), func(tx store.Tx) error { return tx.Commit(e.ctx, []byte("second")) })
	e.commit(held, []byte("first"))
	if rec := e.claim(store.DecisionReplay, "k", "fp").Record; string(rec.Result) != "first" {
		t.Fatalf("record = %+v, want the holder's success only", rec)
	}
}
