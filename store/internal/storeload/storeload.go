// Package storeload is the contract suite's concurrency check, apart so
// that a store's own test can also run it under its own conditions (a small
// connection pool) without it being part of storetest's API.
package storeload

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
)

// Store is a store whose records can be read back.
type Store interface {
	store.Store
	Get(ctx context.Context, scope, key string) (store.Record, error)
}

// Run is the concurrency check every store runs (storetest.Run), and
// store/redisstore's test on its own with a small connection pool: 32 goroutines deliver keys keys, 3 in 10 of them a
// second time right behind the first (so the duplicate often meets the live
// lease), each delivery a ClaimLease and, on Execute, a Complete. Every key must
// execute exactly once and end succeeded with its result, and every duplicate
// must get Replay or InProgress.
func Run(t *testing.T, st Store, scope string, keys int) {
	t.Helper()
	const workers = 32
	ctx := t.Context()
	keyName := func(i int) string { return fmt.Sprintf("k-%d", i) }

	twice := func(i int) bool { return i%10 < 3 }
	dups := 0
	for i := range keys {
		if twice(i) {
			dups++
		}
	}
	deliveries := make(chan int)
	go func() {
		defer close(deliveries)
		for i := range keys {
			deliveries <- i
			if twice(i) {
				deliveries <- i
			}
		}
	}()
	var (
		executes   = make([]atomic.Int32, keys)
		duplicates atomic.Int32
		failed     atomic.Bool
		wg         sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for i := range deliveries {
				key := keyName(i)
				res, err := st.ClaimLease(ctx, store.LeaseRequest{Scope: scope, Key: key, Fingerprint: "fp-" + key, LeaseDuration: time.Minute})
				if err != nil {
					t.Errorf("Begin(%q): %v", key, err)
					failed.Store(true)
					continue
				}
				switch res.Decision {
				case store.DecisionReplay, store.DecisionHeld:
					duplicates.Add(1)
				case store.DecisionExecute:
					executes[i].Add(1)
					if err := st.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: []byte(key), TTL: time.Hour}); err != nil {
						t.Errorf("Complete(%q): %v", key, err)
						failed.Store(true)
					}
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() {
		t.FailNow()
	}
	for i := range keys {
		key := keyName(i)
		if n := executes[i].Load(); n != 1 {
			t.Errorf("%s executed %d times, want once", key, n)
			continue
		}
		if rec, err := st.Get(ctx, scope, key); err != nil || rec.Status != store.StatusSucceeded || string(rec.Result) != key {
			t.Errorf("%s: record %v %q (%v), want succeeded %q", key, rec.Status, rec.Result, err, key)
		}
	}
	if got := duplicates.Load(); got != int32(dups) {
		t.Errorf("%d duplicates got replay or in_progress, want %d", got, dups)
	}
}
