package mysql

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/oncemill/oncemill/store"
)

// gate admits the store's operations until Close, and bounds each by the
// statement timeout.
type gate struct {
	timeout  time.Duration
	mu       sync.RWMutex // guards closed against new operations
	closed   bool
	inflight sync.WaitGroup // operations that got in before Close
}

// enter admits one operation: it refuses once Close has begun, and bounds
// ctx by the timeout plus extra (a wait the operation is allowed on top).
// Call leave with the returned cancel when done.
func (g *gate) enter(ctx context.Context, op string, extra time.Duration) (context.Context, context.CancelFunc, error) {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.closed {
		return ctx, nil, fmt.Errorf("oncemill: mysql: %s: %w", op, store.ErrClosed)
	}
	g.inflight.Add(1)
	ctx, cancel := context.WithTimeout(ctx, g.timeout+extra)
	return ctx, cancel, nil
}

func (g *gate) leave(cancel context.CancelFunc) {
	cancel()
	g.inflight.Done()
}

// close refuses new operations and waits for those already admitted.
func (g *gate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.inflight.Wait()
}
