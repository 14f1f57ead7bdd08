package store_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// The record's life: the first ClaimLease executes, a second one finds it in
// progress, Complete stores the outcome, and later Begins replay it. A stale
// lease can no longer complete.
func Example() {
	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	ctx := context.Background()
	req := store.LeaseRequest{Scope: "payments", Key: "pay-1", Fingerprint: "fp-1", LeaseDuration: 30 * time.Second}

	first, _ := st.ClaimLease(ctx, req)
	fmt.Println(first.Decision, "attempt", first.Claim.Attempt)

	second, _ := st.ClaimLease(ctx, req)
	fmt.Println(second.Decision)

	_ = st.Complete(ctx, first.Claim, store.Completion{Status: store.StatusSucceeded, Result: []byte("ok"), TTL: time.Hour})
	third, _ := st.ClaimLease(ctx, req)
	fmt.Println(third.Decision, third.Record.Status, string(third.Record.Result))

	err = st.Release(ctx, first.Claim, store.Completion{Status: store.StatusRetryable, TTL: time.Hour})
	fmt.Println(errors.Is(err, store.ErrLeaseLost))

	req.Fingerprint = "fp-2"
	other, _ := st.ClaimLease(ctx, req)
	fmt.Println(other.Decision)
	// Output:
	// execute attempt 1
	// held
	// replay succeeded ok
	// true
	// mismatch
}
