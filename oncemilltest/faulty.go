package oncemilltest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/storetest"
)

// ErrInjected is wrapped by every error a FaultyStore injects, so a test can
// tell an injected failure from one of the store itself. Like the store
// sentinels it has no "oncemill: " prefix of its own: the FaultyStore always
// wraps it in an error that has one.
var ErrInjected = errors.New("injected store failure")

// Op names a store operation, for FaultyStore.Fail and Call.Op.
type Op string

// The operations of store.Store, then those of store.Admin.
const (
	OpBegin    Op = "ClaimLease"
	OpComplete Op = "Complete"
	OpRelease  Op = "Release"
	OpExtend   Op = "Extend"

	OpGet              Op = "Get"
	OpList             Op = "List"
	OpDelete           Op = "Delete"
	OpCompareAndDelete Op = "CompareAndDelete"
	OpDeleteExpired    Op = "DeleteExpired"
)

var ops = []Op{OpBegin, OpComplete, OpRelease, OpExtend, OpGet, OpList, OpDelete, OpCompareAndDelete, OpDeleteExpired}

// Call is one operation a FaultyStore saw.
type Call struct {
	Op Op
	// N numbers the calls of Op, from 1, in the order they started.
	N int
	// Scope and Key are the record's (empty for List and DeleteExpired).
	Scope, Key string
	// Lease is the lease the call carried (Complete, Release, Extend), or
	// the one ClaimLease returned with DecisionExecute; Extend records the
	// extended lease once it has it. For CompareAndDelete, Lease.Token is
	// the token compared.
	Lease store.Claim
	// Decision is ClaimLease's answer, once the store gave it.
	Decision store.Decision
	// Err is what the call returned to its caller: an injected error
	// (errors.Is(Err, ErrInjected)) or the store's own. It is nil in the
	// Call a Fault is given.
	Err error
}

// A Fault decides whether one call fails: it returns the error to inject,
// or nil to let the call through. It may also block, to hold the call (a
// slow store, or a worker frozen mid-call); it should then return when ctx
// is done. A Fault is called concurrently when the store is.
type Fault func(ctx context.Context, c Call) error

// Always fails every call with err (ErrInjected when err is nil).
func Always(err error) Fault {
	return func(context.Context, Call) error { return orInjected(err) }
}

// Nth fails the nth call of the operation (counting from 1) with err
// (ErrInjected when err is nil), and lets every other call through.
func Nth(n int, err error) Fault {
	return func(_ context.Context, c Call) error {
		if c.N == n {
			return orInjected(err)
		}
		return nil
	}
}

func orInjected(err error) error {
	if err == nil {
		return ErrInjected
	}
	return err
}

// FaultyStore is a store.Store that passes every call to the store it wraps,
// records it, and fails the calls its faults choose. Use it to see what a
// handler and oncemill do when the store fails at one precise point:
//
//	st := oncemilltest.NewFaultyStore(mem)
//	st.Fail(oncemilltest.OpComplete, oncemilltest.Nth(1, nil))
//	b := receiver.New(st)
//
// An injected error wraps ErrInjected and the Fault's own error, so an
// injected store.ErrLeaseLost is taken for a lost lease. FaultyStore
// implements store.Store only; FaultyAdminStore adds store.Admin.
//
// A failed ClaimLease makes oncemill nack after policy.NackDelay, growing with
// every failure in a row (1s and more by default), and a handler's
// retryable failure nacks after policy.AttemptDelay, growing with the
// attempt (3s and more): give a test's policy a negative NackDelay and
// AttemptDelay to nack at once.
type FaultyStore struct {
	st store.Store

	mu     sync.Mutex
	before map[Op]Fault
	after  map[Op]Fault
	counts map[Op]int
	calls  []Call
}

var _ store.Store = (*FaultyStore)(nil)

// NewFaultyStore wraps st. Until Fail or FailAfter is called, every call
// goes through unchanged.
func NewFaultyStore(st store.Store) *FaultyStore {
	return &FaultyStore{
		st:     st,
		before: map[Op]Fault{},
		after:  map[Op]Fault{},
		counts: map[Op]int{},
	}
}

// Fail sets the fault of op, replacing any earlier one; nil removes it. The
// fault is asked before the call reaches the wrapped store, so a failed call
// changes nothing there: the store could not be reached.
func (s *FaultyStore) Fail(op Op, f Fault) { s.set(s.before, op, f) }

// FailAfter sets a fault of op that is asked after the wrapped store
// succeeded, replacing any earlier one; nil removes it. The call took
// effect, but its caller hears the injected error: a commit whose answer was
// lost on the way back, the failure that is hardest to get right.
func (s *FaultyStore) FailAfter(op Op, f Fault) { s.set(s.after, op, f) }

func (s *FaultyStore) set(m map[Op]Fault, op Op, f Fault) {
	known := false
	for _, o := range ops {
		known = known || o == op
	}
	if !known {
		panic(fmt.Sprintf("oncemill: oncemilltest: %q is not a store operation; use one of the Op constants", string(op)))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if f == nil {
		delete(m, op)
		return
	}
	m[op] = f
}

// Calls returns the calls that have ended, in the order they ended.
func (s *FaultyStore) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Call(nil), s.calls...)
}

// Count returns how many calls of op have started.
func (s *FaultyStore) Count(op Op) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.counts[op]
}

// leaseExpiry is the latest lease expiry the store handed out, by its
// clock: when a crashed worker's lease is gone at the latest.
func (s *FaultyStore) leaseExpiry() time.Time {
	var last time.Time
	for _, c := range s.Calls() {
		if c.Lease.ExpiresAt.After(last) && (c.Op == OpBegin || c.Op == OpExtend) && c.Err == nil {
			last = c.Lease.ExpiresAt
		}
	}
	return last
}

// call runs one operation of the wrapped store between its faults and
// records it. result copies what the answer tells into the Call.
func call[T any](ctx context.Context, s *FaultyStore, c Call, do func() (T, error), result func(*Call, T)) (T, error) {
	s.mu.Lock()
	s.counts[c.Op]++
	c.N = s.counts[c.Op]
	before, after := s.before[c.Op], s.after[c.Op]
	s.mu.Unlock()

	var zero T
	v, err := zero, inject(ctx, before, c)
	if err == nil {
		v, err = do()
		if err == nil {
			if result != nil {
				result(&c, v)
			}
			if err = inject(ctx, after, c); err != nil {
				v = zero
			}
		}
	}
	c.Err = err
	s.mu.Lock()
	s.calls = append(s.calls, c)
	s.mu.Unlock()
	return v, err
}

func inject(ctx context.Context, f Fault, c Call) error {
	if f == nil {
		return nil
	}
	err := f(ctx, c)
	if err == nil {
		return nil
	}
	if !errors.Is(err, ErrInjected) {
		err = fmt.Errorf("%w: %w", ErrInjected, err)
	}
	return fmt.Errorf("oncemill: oncemilltest: %s call %d: %w", c.Op, c.N, err)
}

// Limits is the wrapped store's; it is never failed.
func (s *FaultyStore) Limits() store.Limits { return s.st.Limits() }

// ClaimLease calls the wrapped store's ClaimLease between the faults of OpBegin.
func (s *FaultyStore) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	return call(ctx, s, Call{Op: OpBegin, Scope: req.Scope, Key: req.Key},
		func() (store.ClaimResult, error) { return s.st.ClaimLease(ctx, req) },
		func(c *Call, res store.ClaimResult) { c.Decision, c.Lease = res.Decision, res.Claim })
}

// Complete calls the wrapped store's Complete between the faults of
// OpComplete.
func (s *FaultyStore) Complete(ctx context.Context, lease store.Claim, out store.Completion) error {
	_, err := call(ctx, s, Call{Op: OpComplete, Scope: lease.Scope, Key: lease.Key, Lease: lease},
		func() (struct{}, error) { return struct{}{}, s.st.Complete(ctx, lease, out) }, nil)
	return err
}

// Release calls the wrapped store's Release between the faults of
// OpRelease.
func (s *FaultyStore) Release(ctx context.Context, lease store.Claim, keep time.Duration) error {
	_, err := call(ctx, s, Call{Op: OpRelease, Scope: lease.Scope, Key: lease.Key, Lease: lease},
		func() (struct{}, error) { return struct{}{}, s.st.Release(ctx, lease, keep) }, nil)
	return err
}

// Extend calls the wrapped store's Extend between the faults of OpExtend.
// Failing it is how a test loses a running handler's lease: inject
// store.ErrLeaseLost, and the handler's context is cancelled.
func (s *FaultyStore) Extend(ctx context.Context, lease store.Claim, d time.Duration) (store.Claim, error) {
	return call(ctx, s, Call{Op: OpExtend, Scope: lease.Scope, Key: lease.Key, Lease: lease},
		func() (store.Claim, error) { return s.st.Extend(ctx, lease, d) },
		func(c *Call, l store.Claim) { c.Lease = l })
}

// FaultyAdminStore is a FaultyStore over a store that also has the
// operator's operations (every store of oncemill does): it implements
// store.Store and store.Admin, and can fail both.
type FaultyAdminStore struct {
	*FaultyStore
	admin store.Admin
}

var _ storetest.Store = (*FaultyAdminStore)(nil)

// NewFaultyAdminStore wraps st, a store with both sets of operations, such
// as *memory.Store or *postgres.Store.
func NewFaultyAdminStore(st storetest.Store) *FaultyAdminStore {
	return &FaultyAdminStore{FaultyStore: NewFaultyStore(st), admin: st}
}

// Get calls the wrapped store's Get between the faults of OpGet.
func (s *FaultyAdminStore) Get(ctx context.Context, scope, key string) (store.Record, error) {
	return call(ctx, s.FaultyStore, Call{Op: OpGet, Scope: scope, Key: key},
		func() (store.Record, error) { return s.admin.Get(ctx, scope, key) }, nil)
}

// List calls the wrapped store's List between the faults of OpList.
func (s *FaultyAdminStore) List(ctx context.Context, req store.ListRequest) (store.ListPage, error) {
	return call(ctx, s.FaultyStore, Call{Op: OpList, Scope: req.Scope},
		func() (store.ListPage, error) { return s.admin.List(ctx, req) }, nil)
}

// Delete calls the wrapped store's Delete between the faults of OpDelete.
func (s *FaultyAdminStore) Delete(ctx context.Context, scope, key string) error {
	_, err := call(ctx, s.FaultyStore, Call{Op: OpDelete, Scope: scope, Key: key},
		func() (struct{}, error) { return struct{}{}, s.admin.Delete(ctx, scope, key) }, nil)
	return err
}

// CompareAndDelete calls the wrapped store's CompareAndDelete between the
// faults of OpCompareAndDelete.
func (s *FaultyAdminStore) CompareAndDelete(ctx context.Context, scope, key string, token int64) error {
	_, err := call(ctx, s.FaultyStore, Call{Op: OpCompareAndDelete, Scope: scope, Key: key, Lease: store.Claim{Scope: scope, Key: key, Token: token}},
		func() (struct{}, error) { return struct{}{}, s.admin.CompareAndDelete(ctx, scope, key, token) }, nil)
	return err
}

// DeleteExpired calls the wrapped store's DeleteExpired between the faults
// of OpDeleteExpired.
func (s *FaultyAdminStore) DeleteExpired(ctx context.Context, limit int) (int, error) {
	return call(ctx, s.FaultyStore, Call{Op: OpDeleteExpired},
		func() (int, error) { return s.admin.DeleteExpired(ctx, limit) }, nil)
}
