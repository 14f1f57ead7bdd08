package worker

// The demo: the run mode publishes the workload (workload.go) to its own
// router, waits until every delivery is acknowledged, and counts the
// ledger; the produce mode only publishes, for workers in other processes.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/oncemill/oncemill/pipeline"
)

// acks follows the demo's deliveries from oncemill's events. An ack of a
// message already acked as often as it was published is the broker's own
// redelivery (SQS after a visibility timeout) and does not count.
type acks struct {
	mu         sync.Mutex
	changed    chan struct{} // closed and replaced on every change
	pubs, done map[string]int
	published  int
	acked      int
}

func newAcks() *acks {
	return &acks{changed: make(chan struct{}), pubs: map[string]int{}, done: map[string]int{}}
}

func (a *acks) publishing(_ int, uuid string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pubs[uuid]++
	a.published++
}

func (a *acks) record(ev pipeline.Event) {
	if !ev.Outcome.Acked() {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.done[ev.MessageUUID] < a.pubs[ev.MessageUUID] {
		a.done[ev.MessageUUID]++
		a.acked++
		a.notifyLocked()
	}
}

// notify wakes the waiters.
func (a *acks) notify() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.notifyLocked()
}

func (a *acks) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// waitFor waits until ok (called with a locked) holds or ctx ends, and
// reports whether ok held.
func (a *acks) waitFor(ctx context.Context, ok func() bool) bool {
	for {
		a.mu.Lock()
		done, changed := ok(), a.changed
		a.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}

// room waits until n more deliveries fit in a window of inFlight.
func (a *acks) room(inFlight int) func(ctx context.Context, n int) error {
	return func(ctx context.Context, n int) error {
		a.waitFor(ctx, func() bool { return a.published-a.acked+n <= inFlight })
		return ctx.Err()
	}
}

// state is what was published and acked.
func (a *acks) state() (published, acked int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.published, a.acked
}

// Run publishes plan to its own router, waits until every delivery is
// acknowledged, and returns the summary, nil when the run did not get as far
// as publishing. The error is about the run itself (setup, a publish that
// failed, the timeout); failed checks are in Summary.Problems. A progress
// line goes to stderr every cfg.Progress.
func Run(ctx context.Context, cfg Config, plan *Plan, stderr io.Writer) (*Summary, error) {
	var logErrors atomic.Int64
	log := NewLogger(cfg.LogLevel, cfg.LogFormat, stderr, &logErrors)
	ss, err := OpenStore(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer ss.Close()
	cfg = FreshNames(cfg, ss.Shared)
	b, err := OpenBroker(ctx, cfg, Hooks{}, log)
	if err != nil {
		return nil, err
	}
	defer func() { _ = b.Close() }()

	var tally Tally
	flow := newAcks()
	router, err := NewRouter(cfg, Hooks{}, log, b, ss, RouterOptions{
		OnEvent:      func(ev pipeline.Event) { tally.Record(ev); flow.record(ev) },
		CloseTimeout: 10 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	routerDone, err := StartRouter(ctx, router)
	if err != nil {
		return nil, err
	}

	// Publish and wait, both bounded by the timeout.
	start := time.Now()
	workCtx, cancelWork := context.WithTimeoutCause(ctx, cfg.Timeout, fmt.Errorf("timed out after %v", cfg.Timeout))
	defer cancelWork()
	keys, err := NewKeyGenerator(cfg.Key)
	if err != nil {
		return nil, err
	}
	prod := &Producer{
		Plan: plan, Pub: b.Pub, Topics: Topics{Prefix: cfg.TopicPrefix}, Partitions: cfg.Partitions, Keys: keys,
		Room: flow.room(cfg.InFlight), Publishing: flow.publishing,
	}
	var produced atomic.Bool
	prodDone := make(chan error, 1)
	go func() {
		err := prod.Run(workCtx)
		produced.Store(err == nil)
		flow.notify() // wake the wait below
		prodDone <- err
	}()

	progress := func() {
		published, acked := flow.state()
		counts, _ := ss.Ledger.Counts(workCtx, cfg.Scope)
		fmt.Fprintf(stderr, "progress: acked=%d / %d published, effects=%d replays=%d cached_failures=%d log_errors=%d\n",
			acked, published, TotalCharges(counts), tally.Replays(), tally.CachedFailures(), logErrors.Load())
	}
	completed := WaitProgress(workCtx, cfg.Progress, progress, func(ctx context.Context) bool {
		return flow.waitFor(ctx, func() bool { return produced.Load() && flow.acked == flow.published })
	})
	elapsed := time.Since(start)
	cancelWork()
	prodErr := <-prodDone
	if err := router.Close(); err != nil {
		log.Error("Router close", "error", err)
	}
	<-routerDone

	counts, err := ss.Ledger.Counts(context.WithoutCancel(ctx), cfg.Scope)
	if err != nil {
		return nil, fmt.Errorf("reading the ledger: %w", err)
	}
	sum := &Summary{
		Published:      prod.Commands,
		Deliveries:     prod.Deliveries,
		Unique:         len(prod.KeysSeen),
		Effects:        TotalCharges(counts),
		Replays:        tally.Replays(),
		CachedFailures: tally.CachedFailures(),
		Completed:      completed,
		Elapsed:        elapsed,
	}
	sum.Audit(counts, plan)
	switch {
	case completed:
		return sum, nil
	case prodErr != nil && !errors.Is(prodErr, context.Canceled) && !errors.Is(prodErr, context.DeadlineExceeded):
		return sum, fmt.Errorf("producer: %w", prodErr)
	default:
		published, acked := flow.state()
		return sum, fmt.Errorf("%w; outstanding: %d of %d deliveries published, %d of them not acknowledged",
			context.Cause(workCtx), published, len(plan.Steps), published-acked)
	}
}

// WaitProgress runs wait(ctx) and calls progress every interval until it
// returns, and once more then.
func WaitProgress(ctx context.Context, interval time.Duration, progress func(), wait func(ctx context.Context) bool) bool {
	done := make(chan bool, 1)
	go func() { done <- wait(ctx) }()
	var tick <-chan time.Time
	if interval > 0 {
		ticker := time.NewTicker(interval)
		defer ticker.Stop()
		tick = ticker.C
	}
	for {
		select {
		case ok := <-done:
			if interval > 0 {
				progress()
			}
			return ok
		case <-tick:
			progress()
		}
	}
}

// FreshNames gives a run a key space, ledger scope and topics of its own
// where they are shared with other runs: on a shared store (postgres,
// redis) the scope gets a run suffix, and on a real broker the topics get a
// run prefix unless --topic-prefix was given. Otherwise a second run would
// replay the first one's records, or read its leftovers.
func FreshNames(cfg Config, sharedStore bool) Config {
	id := watermill.NewShortUUID()
	if sharedStore {
		cfg.Scope += "-run-" + id
	}
	if cfg.Broker != "gochannel" && cfg.TopicPrefix == "" {
		cfg.TopicPrefix = "oncemill-run-" + id + "-"
	}
	return cfg
}

// Produce publishes plan, duplicates included, for workers in other
// processes (the consume mode), prints a "produced:" line and returns.
func Produce(ctx context.Context, cfg Config, plan *Plan, hooks Hooks, stdout, stderr io.Writer) error {
	var logErrors atomic.Int64
	b, err := OpenBroker(ctx, cfg, hooks, NewLogger(cfg.LogLevel, cfg.LogFormat, stderr, &logErrors))
	if err != nil {
		return err
	}
	defer func() { _ = b.Close() }()
	keys, err := NewKeyGenerator(cfg.Key)
	if err != nil {
		return fmt.Errorf("key generator: %w", err)
	}
	tp := Topics{Prefix: cfg.TopicPrefix}
	prod := &Producer{Plan: plan, Pub: b.Pub, Topics: tp, Partitions: cfg.Partitions, Keys: keys, Copies: hooks.Copies}

	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Timeout, fmt.Errorf("timed out after %v", cfg.Timeout))
	defer cancel()
	start := time.Now()
	if err := prod.Run(ctx); err != nil {
		return err
	}
	elapsed := time.Since(start)
	fmt.Fprintf(stdout, "produced: commands=%d deliveries=%d unique=%d invalid=%d expected_effects=%d topics=%s..%s elapsed=%v msgs_per_sec=%.0f\n",
		prod.Commands, prod.Deliveries, len(prod.KeysSeen), plan.Invalids, len(plan.Commands)-plan.Invalids,
		tp.Payments(0), tp.Payments(cfg.Partitions-1), elapsed.Round(time.Millisecond), float64(prod.Deliveries)/elapsed.Seconds())
	return nil
}
