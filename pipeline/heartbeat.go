package pipeline

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// ErrLeaseLost is the cause of a handler context canceled because its lease
// was taken over while it ran.
var ErrLeaseLost = fmt.Errorf("oncemill: lease lost while the handler ran: %w", store.ErrLeaseLost)

// heartbeat extends a lease every policy.Heartbeat while the handler runs.
// It is a self-rearming timer rather than a goroutine: a handler that
// finishes within one beat (nearly all) costs one timer and nothing else.
type heartbeat struct {
	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
	st      store.Store
	lease   store.Lease
	p       *policy.Policy
	cancel  context.CancelCauseFunc
}

func startHeartbeat(st store.Store, lease store.Lease, p *policy.Policy, cancel context.CancelCauseFunc) *heartbeat {
	hb := &heartbeat{st: st, lease: lease, p: p, cancel: cancel}
	hb.timer = time.AfterFunc(p.Heartbeat, hb.beat)
	return hb
}

func (hb *heartbeat) beat() {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	if hb.stopped {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), hb.p.Heartbeat)
	lease, err := hb.st.Extend(ctx, hb.lease, hb.p.Lease)
	cancel()
	switch {
	case errors.Is(err, store.ErrLeaseLost):
		// Someone else owns the key now: tell the handler to stop.
		hb.cancel(ErrLeaseLost)
		return
	case err == nil:
		hb.lease = lease
	}
	// A store error is not fatal: the lease is still ours until it expires,
	// and the next beat tries again.
	hb.timer.Reset(hb.p.Heartbeat)
}

// stop waits for a beat in flight, so no Extend runs after the handler.
func (hb *heartbeat) stop() {
	hb.timer.Stop()
	hb.mu.Lock()
	hb.stopped = true
	hb.mu.Unlock()
}
