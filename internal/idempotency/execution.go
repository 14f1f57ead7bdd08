package idempotency

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oncemill/oncemill/internal/claimctx"
	"github.com/oncemill/oncemill/store"
)

// errLeaseLostWhileRunning is the cancel cause of a handler whose lease was
// taken over while it ran, and what CheckLease returns then. It wraps
// store.ErrLeaseLost, the one sentinel callers test for.
var errLeaseLostWhileRunning = fmt.Errorf("oncemill: lease lost while the handler ran: %w", store.ErrLeaseLost)

// execution is one run of the handler under a lease. It is the handler's
// context, its heartbeat, and the detached context for the store writes that
// follow, in one allocation: the stage runs once per message, on a fresh
// router goroutine, and every allocation there is paid for by every message.
type execution struct {
	parent context.Context // the message's context
	lease  store.Claim
	stage  *Leased
	ttl    *retention    // the delivery's TTLs
	stored time.Duration // the TTL its recorder wrote; 0: none

	// inner is the cancelable context, made only when the handler asks for
	// Done or Err, or when the lease is lost: most fast handlers never pay
	// for it.
	inner  atomic.Pointer[cancelable]
	innerM sync.Mutex

	// confirmed is when the lease was last known to be ours, by
	// monotonicNow: ClaimLease's answer, or the sending of an Extend the store
	// accepted. The lease runs policy.LeaseDuration from then (heldFor).
	confirmed atomic.Int64

	// The heartbeat: a slot of the stage's heartbeats (slot, beatAt), or,
	// when they are all taken, a timer of its own. beatMu is held by a beat
	// in flight; stopped, set under it, ends the beats.
	slot    int32
	beatAt  atomic.Int64
	beating atomic.Bool // a beat the stage's heartbeats started is in flight
	timer   *time.Timer
	beatMu  sync.Mutex
	stopped bool

	detached detached
}

type cancelable struct {
	ctx    context.Context
	cancel context.CancelCauseFunc
}

var (
	_ context.Context = (*execution)(nil)
	_ claimctx.Lease  = (*execution)(nil)
)

func newExecution(parent context.Context, lease store.Claim, stage *Leased) *execution {
	e := &execution{parent: parent, lease: lease, stage: stage}
	e.detached.parent = parent
	return e
}

// clockBase makes monotonicNow a reading of the monotonic clock that fits
// an atomic.Int64.
var clockBase = time.Now()

func monotonicNow() int64 { return int64(time.Since(clockBase)) }

// confirmedAt notes that the lease was ours at t (a monotonicNow reading).
func (e *execution) confirmedAt(t int64) { e.confirmed.Store(t) }

// heldFor is how long the lease is still ours by the local clock, less a
// tenth of the lease for the time ClaimLease's answer was on its way and for the
// two clocks' drift: the store judges expiry by its own clock.
func (e *execution) heldFor() time.Duration {
	lease := e.stage.policy.LeaseDuration
	return lease - lease/10 - time.Duration(monotonicNow()-e.confirmed.Load())
}

// current is the context the handler's context delegates to.
func (e *execution) current() context.Context {
	if c := e.inner.Load(); c != nil {
		return c.ctx
	}
	return e.parent
}

func (e *execution) cancelable() *cancelable {
	if c := e.inner.Load(); c != nil {
		return c
	}
	e.innerM.Lock()
	defer e.innerM.Unlock()
	if c := e.inner.Load(); c != nil {
		return c
	}
	ctx, cancel := context.WithCancelCause(e.parent)
	c := &cancelable{ctx: ctx, cancel: cancel}
	e.inner.Store(c)
	return c
}

// Deadline, Done, Err and Value make the execution the handler's context.
// Once the cancelable context exists, everything (context.Cause included,
// which finds it through Value) goes to it.
func (e *execution) Deadline() (time.Time, bool) { return e.parent.Deadline() }
func (e *execution) Done() <-chan struct{}       { return e.cancelable().ctx.Done() }
func (e *execution) Err() error                  { return e.current().Err() }
func (e *execution) Value(key any) any {
	switch key.(type) {
	case claimctx.ClaimKey:
		return &e.lease
	case claimctx.LeaseKey:
		return e
	}
	return e.current().Value(key)
}

// lose cancels the handler's context with a cause wrapping store.ErrLeaseLost.
func (e *execution) lose() { e.cancelable().cancel(errLeaseLostWhileRunning) }

// finish releases the cancelable context, if one was made.
func (e *execution) finish() {
	if c := e.inner.Load(); c != nil {
		c.cancel(nil)
	}
}

// startHeartbeat extends the lease every policy.Heartbeat while the handler
// runs: through a slot of the stage's heartbeats, or, when they are all
// taken, a self-rearming timer of its own.
func (e *execution) startHeartbeat() {
	if e.stage.beats.add(e) {
		return
	}
	// Held so that a first beat firing at once finds the timer assigned.
	e.beatMu.Lock()
	e.timer = time.AfterFunc(e.stage.policy.Heartbeat, e.beat)
	e.beatMu.Unlock()
}

func (e *execution) beat() {
	e.beatMu.Lock()
	defer e.beatMu.Unlock()
	if e.stopped {
		return
	}
	// An Extend may take as long as a lease: a slow store that still
	// answers within the lease keeps it, and one that answers later finds
	// the lease expired and says so. (Cutting it off at the heartbeat
	// interval lost leases to stores slower than that, and pgx closes the
	// connection of a cancelled query.)
	ctx, cancel := context.WithTimeout(&e.detached, e.stage.policy.LeaseDuration)
	err := e.extend(ctx)
	cancel()
	if errors.Is(err, store.ErrLeaseLost) {
		e.stopped = true // the handler has been told; nothing left to keep
		return
	}
	// Another store error is not fatal: the lease is ours until it
	// expires, and the next beat tries again.
	if e.timer != nil {
		e.timer.Reset(e.stage.policy.Heartbeat)
	}
}

// extend pushes the lease expiry out; when the lease is gone, the handler's
// context is canceled.
func (e *execution) extend(ctx context.Context) error {
	sent := monotonicNow()
	ctx, m := e.stage.tel.startStore(ctx, opExtend)
	_, err := e.stage.store.Extend(ctx, e.lease, e.stage.policy.LeaseDuration)
	m.end(ctx, err)
	switch {
	case err == nil:
		e.confirmedAt(sent)
	case errors.Is(err, store.ErrLeaseLost):
		e.lose()
		return errLeaseLostWhileRunning
	case errors.Is(context.Cause(ctx), errLeaseLostWhileRunning):
		// Another extend (a heartbeat) found the lease gone while this one
		// was in flight, and canceled ctx, the handler's, under it.
		return fmt.Errorf("%w (the extend in flight ended with: %w)", errLeaseLostWhileRunning, err)
	}
	return err
}

// stopHeartbeat waits for a beat in flight, so no Extend runs after the handler.
func (e *execution) stopHeartbeat() {
	if e.timer != nil {
		e.timer.Stop()
	} else {
		e.stage.beats.remove(e)
	}
	e.beatMu.Lock()
	e.stopped = true
	e.beatMu.Unlock()
}

// detached is the message's context without its cancellation: the store
// writes after the handler record what already happened, so a router that is
// shutting down must not cut them short. Stores bound their own operations
// (connection and statement timeouts). Like context.WithoutCancel, but
// inside the execution's allocation.
type detached struct{ parent context.Context }

func (detached) Deadline() (time.Time, bool) { return time.Time{}, false }
func (detached) Done() <-chan struct{}       { return nil }
func (detached) Err() error                  { return nil }
func (d *detached) Value(key any) any        { return d.parent.Value(key) }

// Check is the lease's pipeline.CheckLease: an extend, now.
func (e *execution) Check(ctx context.Context) error { return e.extend(ctx) }
