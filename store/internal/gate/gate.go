// Package gate admits a store's operations until the store is closed, and
// bounds each by the store's statement timeout.
package gate

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/oncemill/oncemill/store"
)

// Gate admits operations (Enter) until Close. The zero value with Store
// and Timeout set is ready to use.
type Gate struct {
	// Store names the store in errors ("postgres").
	Store string
	// Timeout bounds every operation (Options.StatementTimeout).
	Timeout time.Duration

	mu       sync.RWMutex // guards closed against new operations
	closed   bool
	inflight sync.WaitGroup // operations that got in before Close
}

// Enter admits one operation: it refuses once Close has begun, and bounds
// ctx by Timeout plus extra (a wait the operation is allowed on top). Call
// Leave with the returned cancel when done.
func (g *Gate) Enter(ctx context.Context, op string, extra time.Duration) (context.Context, context.CancelFunc, error) {
	g.mu.RLock()
	if g.closed {
		g.mu.RUnlock()
		return ctx, nil, fmt.Errorf("oncemill: %s: %s: %w", g.Store, op, store.ErrClosed)
	}
	g.inflight.Add(1)
	g.mu.RUnlock()
	ctx, cancel := context.WithTimeout(ctx, g.Timeout+extra)
	return ctx, cancel, nil
}

// Leave ends an operation that Enter admitted.
func (g *Gate) Leave(cancel context.CancelFunc) {
	cancel()
	g.inflight.Done()
}

// Close refuses new operations and waits for those already admitted.
func (g *Gate) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.inflight.Wait()
}

// Closed reports whether Close has begun.
func (g *Gate) Closed() bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.closed
}
