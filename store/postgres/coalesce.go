package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// call is one caller's request waiting for its share of a coalesced
// statement.
type call[Req, Res any] struct {
	ctx context.Context
	req Req
	res Res
	err error
	// done is closed once res and err are set.
	done chan struct{}
	// lead receives when the call is promoted to lead the next batch.
	lead chan struct{}
	// retries counts the statements that answered every other request of
	// the call's round but not this one (the READ COMMITTED corner).
	retries int
}

func (c *call[Req, Res]) finish(res Res, err error) {
	c.res, c.err = res, err
	close(c.done)
}

// batcher coalesces concurrent requests of one kind into shared statements,
// without goroutines of its own: the callers run the statements.
//
// A caller that finds fewer than BatchWorkers statements running becomes a
// leader: it takes its own request and whatever else is queued, up to
// MaxBatch, and runs them at once, without waiting for more. A lone caller
// thus goes alone, immediately, in its own goroutine. Callers that find all
// leaders busy queue up. A leader that has finished its batch promotes the
// oldest queued caller, which leads everything queued by then: under load
// each statement carries what arrived while the previous one ran, and a
// batch costs one goroutine wake-up rather than one per request.
type batcher[Req, Res any] struct {
	max, maxLeaders int
	run             func(ctx context.Context, calls []*call[Req, Res])

	mu      sync.Mutex
	queue   []*call[Req, Res]
	leaders int
}

func newBatcher[Req, Res any](workers, max int, run func(context.Context, []*call[Req, Res])) *batcher[Req, Res] {
	return &batcher[Req, Res]{max: max, maxLeaders: workers, run: run}
}

// queued is how many requests wait for a leader.
func (b *batcher[Req, Res]) queued() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue)
}

// do runs req in a batch and returns its result, or ctx's error when the
// caller gives up first.
func (b *batcher[Req, Res]) do(ctx context.Context, req Req) (Res, error) {
	c := &call[Req, Res]{ctx: ctx, req: req, done: make(chan struct{})}
	b.mu.Lock()
	if b.leaders < b.maxLeaders {
		b.leaders++
		b.mu.Unlock()
		b.lead(c)
		return c.res, c.err
	}
	c.lead = make(chan struct{}, 1)
	b.queue = append(b.queue, c)
	b.mu.Unlock()

	select {
	case <-c.done:
		return c.res, c.err
	case <-c.lead:
		b.lead(c)
		return c.res, c.err
	case <-ctx.Done():
		return b.abandon(c)
	}
}

// abandon takes a caller whose context ended out of the queue. A call a
// leader has already taken is finished by that leader; a call promoted to
// lead passes the promotion on.
func (b *batcher[Req, Res]) abandon(c *call[Req, Res]) (Res, error) {
	var zero Res
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-c.done: // answered after all
		return c.res, c.err
	default:
	}
	for i, q := range b.queue {
		if q == c {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			return zero, c.ctx.Err()
		}
	}
	select {
	case <-c.lead:
		b.handOff() // the promotion goes to the next in line
	default:
		// A leader took it into a batch; it finishes the call, unseen.
	}
	return zero, c.ctx.Err()
}

// lead runs first together with what is queued, then passes leadership on.
func (b *batcher[Req, Res]) lead(first *call[Req, Res]) {
	b.mu.Lock()
	n := min(len(b.queue), b.max-1)
	batch := make([]*call[Req, Res], 0, n+1)
	batch = append(batch, first)
	batch = append(batch, b.queue[:n]...)
	b.queue = append(b.queue[:0], b.queue[n:]...)
	b.mu.Unlock()

	defer func() {
		if r := recover(); r != nil {
			// A bug: answer the batch and pass leadership on, so that no
			// other caller waits forever, then let the panic go on.
			var zero Res
			for _, c := range batch {
				select {
				case <-c.done:
				default:
					c.finish(zero, fmt.Errorf("postgres: internal error: %v", r))
				}
			}
			b.mu.Lock()
			b.handOff()
			b.mu.Unlock()
			panic(r)
		}
	}()
	b.flush(batch)

	b.mu.Lock()
	b.handOff()
	b.mu.Unlock()
}

// handOff promotes the oldest queued call to lead, or retires a leader when
// nothing is queued. b.mu is held.
func (b *batcher[Req, Res]) handOff() {
	if len(b.queue) > 0 {
		next := b.queue[0]
		b.queue = append(b.queue[:0], b.queue[1:]...)
		next.lead <- struct{}{}
		return
	}
	b.leaders--
}

// flush runs a batch. Requests whose callers have gone are answered without
// a statement.
func (b *batcher[Req, Res]) flush(batch []*call[Req, Res]) {
	live := make([]*call[Req, Res], 0, len(batch))
	for _, c := range batch {
		if err := c.ctx.Err(); err != nil {
			var zero Res
			c.finish(zero, err)
			continue
		}
		live = append(live, c)
	}
	if len(live) == 0 {
		return
	}
	ctx, cancel := batchContext(live)
	defer cancel()
	b.run(ctx, live)
}

// batchContext bounds a shared statement by its callers: it carries the
// latest of their deadlines when every one has a deadline, and none
// otherwise. One caller canceling does not cancel the others' statement;
// that caller stops waiting.
func batchContext[Req, Res any](calls []*call[Req, Res]) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range calls {
		d, ok := c.ctx.Deadline()
		if !ok {
			return context.Background(), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.Background(), latest)
}

// do runs req through the store's batcher b, unless the store is closed.
// Close waits for every request that got in (s.inflight).
func do[Req, Res any](s *Store, b *batcher[Req, Res], ctx context.Context, op string, req Req) (Res, error) {
	var zero Res
	s.mu.RLock()
	if s.closed {
		s.mu.RUnlock()
		return zero, s.closedErr(op)
	}
	s.inflight.Add(1)
	s.mu.RUnlock()
	defer s.inflight.Done()
	res, err := b.do(ctx, req)
	if err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		return zero, wrap(op, err)
	}
	return res, err
}
