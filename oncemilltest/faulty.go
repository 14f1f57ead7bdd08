package oncemilltest

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/oncemill/oncemill/store"
)

// FaultyStore is a store.Store that passes every call to the Store it
// embeds, and fails the calls Fail or FailAfter choose. Use it to see what
// a handler and oncemill do when the store fails at one precise point:
//
//	st := &oncemilltest.FaultyStore{Store: mem, Fail: func(_ context.Context, op string, n int) error {
//		if op == "Complete" && n == 1 {
//			return errDown // the first Complete cannot reach the store
//		}
//		return nil
//	}}
//	b := receiver.New(st)
//
// The operations are ClaimLease, Complete, Release and Extend, named as
// their methods; Limits is never failed. An injected error is returned
// wrapped, as "oncemill: oncemilltest: <op> call <n>: <err>", so that
// errors.Is finds it, and an injected store.ErrLeaseLost is taken for a
// lost lease.
//
// Set Fail and FailAfter before the store is in use; a fault that changes
// its mind does so by state of its own (an atomic.Bool, a counter). A
// FaultyStore must not be copied once used.
//
// A failed ClaimLease makes oncemill nack after policy.NackDelay, growing
// with every failure in a row (1s and more by default), and a handler's
// retryable failure nacks after policy.AttemptDelay, growing with the
// attempt (3s and more): give a test's policy a negative NackDelay and
// AttemptDelay to nack at once.
type FaultyStore struct {
	store.Store

	// Fail, when set, is asked before a call reaches Store, with the
	// operation's name and the number of this call of it, from 1. A
	// non-nil error fails the call, which changes nothing in Store: the
	// store could not be reached. Fail may also block, to hold the call (a
	// slow store, a worker frozen mid-call); it should then return when
	// ctx is done. It is called concurrently when the store is.
	Fail func(ctx context.Context, op string, n int) error
	// FailAfter, when set, is asked after Store succeeded, as Fail is. A
	// non-nil error is what the caller hears, though the call took effect:
	// a commit whose answer was lost on the way back, the failure that is
	// hardest to get right.
	FailAfter func(ctx context.Context, op string, n int) error

	mu     sync.Mutex
	counts map[string]int
}

var _ store.Store = (*FaultyStore)(nil)

// call runs one operation of Store between the faults.
func call[T any](ctx context.Context, s *FaultyStore, op string, do func() (T, error)) (T, error) {
	s.mu.Lock()
	if s.counts == nil {
		s.counts = map[string]int{}
	}
	s.counts[op]++
	n := s.counts[op]
	s.mu.Unlock()

	var zero T
	if err := inject(ctx, s.Fail, op, n); err != nil {
		return zero, err
	}
	v, err := do()
	if err != nil {
		return v, err
	}
	if err := inject(ctx, s.FailAfter, op, n); err != nil {
		return zero, err
	}
	return v, nil
}

func inject(ctx context.Context, f func(context.Context, string, int) error, op string, n int) error {
	if f == nil {
		return nil
	}
	if err := f(ctx, op, n); err != nil {
		return fmt.Errorf("oncemill: oncemilltest: %s call %d: %w", op, n, err)
	}
	return nil
}

// ClaimLease calls Store's ClaimLease between the faults of "ClaimLease".
func (s *FaultyStore) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	return call(ctx, s, "ClaimLease", func() (store.ClaimResult, error) { return s.Store.ClaimLease(ctx, req) })
}

// Complete calls Store's Complete between the faults of "Complete".
func (s *FaultyStore) Complete(ctx context.Context, lease store.Claim, out store.Completion) error {
	_, err := call(ctx, s, "Complete", func() (struct{}, error) { return struct{}{}, s.Store.Complete(ctx, lease, out) })
	return err
}

// Release calls Store's Release between the faults of "Release".
func (s *FaultyStore) Release(ctx context.Context, lease store.Claim, keep time.Duration) error {
	_, err := call(ctx, s, "Release", func() (struct{}, error) { return struct{}{}, s.Store.Release(ctx, lease, keep) })
	return err
}

// Extend calls Store's Extend between the faults of "Extend". Failing it
// with store.ErrLeaseLost is how a test loses a running handler's lease:
// the handler's context is cancelled.
func (s *FaultyStore) Extend(ctx context.Context, lease store.Claim, d time.Duration) (store.Claim, error) {
	return call(ctx, s, "Extend", func() (store.Claim, error) { return s.Store.Extend(ctx, lease, d) })
}
