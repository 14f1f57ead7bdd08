package main

// run: assemble the router, publish the workload, wait until every delivery
// is acknowledged, and report.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/pipeline"
)

// run executes one workload and returns its summary, which it also writes to
// stdout (the summary line last). The error is about the run itself (setup,
// a publish that failed, the timeout); failed checks are in summary.problems.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) (summary, error) {
	var logErrors atomic.Int64
	logger := newLogger(cfg.LogLevel, stderr, &logErrors)

	st, closeStore, err := newStore(cfg)
	if err != nil {
		return summary{}, err
	}
	defer closeStore()
	counting := newCountingStore(st)

	b, err := newBroker(cfg, logger)
	if err != nil {
		return summary{}, err
	}
	defer b.close()

	keys, err := newKeyGenerator()
	if err != nil {
		return summary{}, fmt.Errorf("key generator: %w", err)
	}

	p := newPlan(cfg)
	led := newLedger()
	var outcomes tally
	flow := newTracker(cfg.Partitions)

	guard, err := newGuard(cfg, counting, keys, logger, outcomes.record)
	if err != nil {
		return summary{}, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return summary{}, fmt.Errorf("router: %w", err)
	}
	h := &paymentHandler{gateway: newGateway(p, cfg.Lease*3/2, cfg.Overlap), ledger: led}
	for i := range cfg.Partitions {
		rh := router.AddHandler(fmt.Sprintf("payments-%d", i), paymentsTopic(i), b.sub, settlementsTopic, b.pub, h.handle)
		// First added is outermost: the tracker sees what the router does.
		rh.AddMiddleware(flow.middleware(i), guard)
	}
	router.AddConsumerHandler("settlements", settlementsTopic, b.sub, flow.settle)

	// The router stops through Close once the numbers are final, not when
	// ctx ends: an interrupted run still stops in order and reports.
	routerCtx, stopRouter := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRouter()
	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(routerCtx) }()
	select {
	case <-router.Running():
	case err := <-routerDone:
		return summary{}, fmt.Errorf("router stopped before running: %w", err)
	case <-ctx.Done():
		_ = router.Close()
		return summary{}, context.Cause(ctx)
	}

	// Publish and wait, both bounded by the timeout.
	start := time.Now()
	workCtx, cancelWork := context.WithTimeoutCause(ctx, cfg.Timeout, fmt.Errorf("timed out after %v", cfg.Timeout))
	defer cancelWork()
	prod := newProducer(p, b.pub, keys, flow, cfg.InFlight)
	prodDone := make(chan error, 1)
	go func() { prodDone <- prod.run(workCtx) }()

	progress := func() {
		fs := flow.state()
		fmt.Fprintf(stderr, "progress: acked=%d / %d in_flight=%d effects=%d replays=%d cached_failures=%d in_progress_keys=%d takeovers=%d log_errors=%d\n",
			fs.acked, p.deliveries, fs.inFlight, led.effects(), outcomes.replays(), outcomes.cachedFailures(),
			counting.contendedKeys(), outcomes.takeovers.Load(), logErrors.Load())
	}
	completed := waitComplete(workCtx, flow, p.deliveries, cfg.Progress, progress)
	elapsed := time.Since(start)
	cancelWork()
	prodErr := <-prodDone
	if err := router.Close(); err != nil {
		logger.Error("Router close", err, nil)
	}
	<-routerDone

	sum := summarize(p, prod, led, &outcomes, flow, counting, &logErrors, elapsed, completed, !cfg.NoIdempotency)
	sum.write(stdout)

	switch {
	case completed:
		return sum, nil
	case prodErr != nil && !errors.Is(prodErr, context.Canceled) && !errors.Is(prodErr, context.DeadlineExceeded):
		return sum, fmt.Errorf("producer: %w", prodErr)
	default:
		return sum, fmt.Errorf("%w; outstanding: %s", context.Cause(workCtx), outstanding(flow.state(), p.deliveries))
	}
}

// waitComplete waits until every planned delivery is published and
// acknowledged and every produced settlement received, printing progress
// every interval. It returns false when ctx ends first.
func waitComplete(ctx context.Context, flow *tracker, deliveries int, interval time.Duration, progress func()) bool {
	done := make(chan bool, 1)
	go func() {
		done <- flow.waitFor(ctx, 0, func(t *tracker) bool {
			return t.published == deliveries && t.acked >= deliveries && t.settled >= t.produced
		})
	}()
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

// outstanding says what a run that did not complete was still waiting for.
func outstanding(fs flowState, deliveries int) string {
	return fmt.Sprintf("%d of %d deliveries not published, %d published and not acknowledged, %d produced settlements not received",
		deliveries-fs.published, deliveries, fs.published-fs.acked, max(fs.produced-fs.settled, 0))
}

func summarize(p *plan, prod *producer, led *ledger, outcomes *tally, flow *tracker, st *countingStore, logErrors *atomic.Int64,
	elapsed time.Duration, completed, idempotent bool) summary {
	fs := flow.state()
	double, lost, doubled := led.audit(p.commands, p.valid)
	s := summary{
		Published:      prod.commands,
		Deliveries:     fs.published,
		Unique:         len(prod.keysSeen),
		Effects:        led.effects(),
		Replays:        outcomes.replays(),
		CachedFailures: outcomes.cachedFailures(),
		DoubleEffects:  double,
		Lost:           lost,
		Doubled:        doubled,

		Commands:       len(p.commands),
		Invalid:        p.counts.invalid,
		Planned:        p.deliveries,
		Completed:      completed,
		Elapsed:        elapsed,
		AckedByRouter:  fs.acked,
		AckedByEvents:  outcomes.acked.Load(),
		Outcomes:       map[pipeline.Outcome]int64{},
		Takeovers:      outcomes.takeovers.Load(),
		InProgressKeys: st.contendedKeys(),
		Produced:       fs.produced,
		Settled:        fs.settled,
		SettledUUIDs:   fs.distinctSettlements,
		LogErrors:      logErrors.Load(),
		Faults:         p.counts,
		Idempotent:     idempotent,
	}
	for o := pipeline.Executed; o <= pipeline.StoreFailed; o++ {
		s.Outcomes[o] = outcomes.count(o)
	}
	if secs := elapsed.Seconds(); secs > 0 {
		s.MsgsPerSec = float64(s.Deliveries) / secs
	}
	return s
}
