package storetest

import (
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
)

// The message UUID of the claim that executes is kept in the record, and
// the next claimer's replaces it: an operator holding a message finds the
// record of its last delivery (List with MessageUUID), whatever the key.

// uuidsOf lists the scope's records claimed by uuid, as "key/status".
func (e *env) uuidsOf(uuid string) []string {
	e.t.Helper()
	var got []string
	req := store.ListRequest{Scope: e.scope, MessageUUID: uuid, Limit: 2}
	for pages := 0; ; pages++ {
		page, err := e.s.List(e.ctx, req)
		if err != nil {
			e.t.Fatalf("List(MessageUUID %q): %v", uuid, err)
		}
		for _, r := range page.Records {
			if r.MessageUUID != uuid {
				e.t.Fatalf("List(MessageUUID %q) gave the record of %q: %+v", uuid, r.MessageUUID, r)
			}
			got = append(got, r.Key+"/"+r.Status.String())
		}
		if page.Next == "" || pages > 10 {
			return got
		}
		req.After = page.Next
	}
}

func (e *env) wantUUID(key, uuid string) store.Record {
	e.t.Helper()
	rec := e.get(key)
	if rec.MessageUUID != uuid {
		e.t.Fatalf("Get(%q).MessageUUID = %q, want %q", key, rec.MessageUUID, uuid)
	}
	return rec
}

func (e *env) claimAs(key, uuid string) store.ClaimResult {
	e.t.Helper()
	req := e.req(key, "fp", lease)
	req.MessageUUID = uuid
	res, err := e.s.ClaimLease(e.ctx, req)
	if err != nil {
		e.t.Fatalf("ClaimLease(%q as %q): %v", key, uuid, err)
	}
	return res
}

func testMessageUUID(t *testing.T, e *env) {
	const first, second, third = "0192f3a4-first", "0192f3a4-second", "0192f3a4-third"
	// An in-progress record carries its claimer's UUID, and so does the
	// finished one.
	res := e.claimAs("done", first)
	if res.Decision != store.DecisionExecute || res.Claim.MessageUUID != first {
		t.Fatalf("ClaimLease = %v with lease %+v, want Execute carrying %q", res.Decision, res.Claim, first)
	}
	e.wantUUID("done", first)
	e.complete(res.Claim, success([]byte("r")))
	e.wantUUID("done", first)
	// A duplicate that replays changes nothing; its answer shows the UUID.
	if dup := e.claimAs("done", second); dup.Decision != store.DecisionReplay || dup.Record.MessageUUID != first {
		t.Fatalf("duplicate = %v with record %+v, want Replay of %q's record", dup.Decision, dup.Record, first)
	}
	e.wantUUID("done", first)

	// A retry by another delivery, and a takeover, replace it.
	l := e.claimAs("retried", first).Claim
	e.release(l, ttl)
	e.wantUUID("retried", first)
	l = e.claimAs("retried", second).Claim
	e.wantUUID("retried", second)
	e.advance(lease + time.Second)
	taken := e.claimAs("retried", third)
	if !taken.Takeover {
		t.Fatalf("ClaimLease after the lease expired = %+v, want a takeover", taken)
	}
	e.leaseLost("the stale holder's Complete", e.s.Complete(e.ctx, l, success(nil)))
	e.complete(taken.Claim, store.Completion{Status: store.StatusCachedFailure, ErrorKind: store.ErrorKindCached, ErrorMessage: "x", TTL: ttl})
	e.wantUUID("retried", third)

	// A record claimed without a UUID has none.
	e.complete(e.execute("none", "fp"), success(nil))
	e.wantUUID("none", "")

	if got := e.uuidsOf(first); len(got) != 1 || got[0] != "done/succeeded" {
		t.Fatalf("List(MessageUUID %q) = %v, want [done/succeeded]", first, got)
	}
	if got := e.uuidsOf(third); len(got) != 1 || got[0] != "retried/cached_failure" {
		t.Fatalf("List(MessageUUID %q) = %v, want [retried/cached_failure]", third, got)
	}
	if got := e.uuidsOf(second); len(got) != 0 {
		t.Fatalf("List(MessageUUID %q) = %v, want none: a later claim replaced it", second, got)
	}
}

func testTxMessageUUID(t *testing.T, e *txEnv) {
	const first, second = "0192f3a4-tx-first", "0192f3a4-tx-second"
	claim := func(key, uuid string) store.TxResult {
		t.Helper()
		req := e.req(key, "fp")
		req.MessageUUID = uuid
		res, err := e.tx.ClaimInTx(e.ctx, req)
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimInTx(%q as %q) = %+v, %v; want Execute", key, uuid, res, err)
		}
		if res.Claim.MessageUUID != uuid {
			t.Fatalf("ClaimInTx(%q as %q): lease %+v does not carry the UUID", key, uuid, res.Claim)
		}
		return res
	}
	// A committed success.
	e.commit(claim("ok", first), []byte("r"))
	e.wantUUID("ok", first)
	if dup := e.claim(store.DecisionReplay, "ok", "fp"); dup.Record.MessageUUID != first {
		t.Fatalf("replayed record = %+v, want %q's", dup.Record, first)
	}

	// A failure recorded after the rollback, by a second delivery of the key:
	// its own UUID, as a dead-lettered message's lookup needs.
	res := claim("failed", first)
	e.rollback(res)
	if err := e.record(res.Claim, retryable(ttl)); err != nil {
		t.Fatal(err)
	}
	e.wantUUID("failed", first)
	res = claim("failed", second)
	e.rollback(res)
	if err := e.record(res.Claim, store.Completion{Status: store.StatusCachedFailure, ErrorKind: store.ErrorKindAttemptsExhausted, ErrorMessage: "x", TTL: ttl}); err != nil {
		t.Fatal(err)
	}
	e.wantUUID("failed", second)

	if got := e.uuidsOf(second); len(got) != 1 || got[0] != "failed/cached_failure" {
		t.Fatalf("List(MessageUUID %q) = %v, want [failed/cached_failure]", second, got)
	}
	if got := e.uuidsOf(first); len(got) != 1 || got[0] != "ok/succeeded" {
		t.Fatalf("List(MessageUUID %q) = %v, want [ok/succeeded]", first, got)
	}
}
