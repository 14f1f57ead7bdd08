// Package crashstore is the store of oncemilltest.DeliverAfterCrash's
// workers: a store.Store whose writes of an outcome fail while the worker
// crashes, as a dead process's would.
package crashstore

import (
	"context"
	"sync/atomic"

	"github.com/oncemill/oncemill/store"
)

// Store passes every call to the Store it embeds, except that Complete and
// Release fail with Crash while Crashing is set. It counts ClaimLease
// calls, so the helper can tell that the receiver was built over it.
type Store struct {
	store.Store
	Crash    error
	Crashing atomic.Bool
	Claims   atomic.Int64
}

var _ store.Store = (*Store)(nil)

// ClaimLease counts the call and passes it on.
func (s *Store) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	s.Claims.Add(1)
	return s.Store.ClaimLease(ctx, req)
}

// Complete fails while crashing.
func (s *Store) Complete(ctx context.Context, lease store.Claim, out store.Completion) error {
	if s.Crashing.Load() {
		return s.Crash
	}
	return s.Store.Complete(ctx, lease, out)
}

// Release fails while crashing.
func (s *Store) Release(ctx context.Context, lease store.Claim, out store.Completion) error {
	if s.Crashing.Load() {
		return s.Crash
	}
	return s.Store.Release(ctx, lease, out)
}
