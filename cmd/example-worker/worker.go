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

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/pipeline"
)

// run executes one workload and returns its summary, which it also writes to
// stdout (the summary line last). The error is about the run itself (setup,
// a publish that failed, the timeout); failed checks are in summary.problems.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) (summary, error) {
	var logErrors atomic.Int64
	log := newLogger(cfg.LogLevel, cfg.LogFormat, stderr, &logErrors)
	logger := watermill.NewSlogLogger(log)

	ss, err := newStore(ctx, cfg)
	if err != nil {
		return summary{}, err
	}
	defer ss.close()
	cfg = freshNames(cfg, ss.shared)

	b, err := newBroker(cfg, logger)
	if err != nil {
		return summary{}, err
	}
	defer func() { _ = b.close() }()
	tp := topics{prefix: cfg.TopicPrefix}
	if err := b.initTopics(ctx, tp.all(cfg.Partitions)); err != nil {
		return summary{}, err
	}

	keys, err := newKeyGenerator(cfg.Key)
	if err != nil {
		return summary{}, fmt.Errorf("key generator: %w", err)
	}

	p := newPlan(cfg)
	var outcomes tally
	flow := newTracker(cfg.Partitions)

	guard, err := newGuard(cfg, guardDeps{
		store: ss.store, tx: ss.tx, keys: keys, log: log, onEvent: outcomes.record, system: b.system,
	})
	if err != nil {
		return summary{}, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 10 * time.Second}, logger)
	if err != nil {
		return summary{}, fmt.Errorf("router: %w", err)
	}
	h := &paymentHandler{gateway: newGateway(p, cfg.Lease*3/2, cfg.Overlap, cfg.GatewayLatency), ledger: ss.ledger, scope: cfg.Scope}
	for i := range cfg.Partitions {
		topic := tp.payments(i)
		sub, err := b.subscriber(cfg.ConsumerGroup + "-" + topic)
		if err != nil {
			return summary{}, fmt.Errorf("subscriber of %s: %w", topic, err)
		}
		rh := router.AddHandler(fmt.Sprintf("payments-%d", i), topic, sub, tp.settlements(), b.handlerPublisher(), h.handle)
		// First added is outermost: the tracker sees what the router does.
		rh.AddMiddleware(flow.middleware(i), guard)
	}
	settleSub, err := b.subscriber(cfg.ConsumerGroup + "-" + tp.settlements())
	if err != nil {
		return summary{}, fmt.Errorf("subscriber of %s: %w", tp.settlements(), err)
	}
	router.AddConsumerHandler("settlements", tp.settlements(), settleSub, flow.settle)

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
	prod := newProducer(p, b.pub, tp, keys, flow, cfg.InFlight)
	prodDone := make(chan error, 1)
	go func() { prodDone <- prod.run(workCtx) }()

	progress := func() {
		fs := flow.state()
		counts, _ := ss.ledger.counts(workCtx, cfg.Scope)
		fmt.Fprintf(stderr, "progress: acked=%d / %d in_flight=%d effects=%d replays=%d cached_failures=%d in_progress_keys=%d takeovers=%d log_errors=%d\n",
			fs.acked, p.deliveries, fs.inFlight, totalCharges(counts), outcomes.replays(), outcomes.cachedFailures(),
			outcomes.contendedKeys(), outcomes.takeovers.Load(), logErrors.Load())
	}
	completed := waitComplete(workCtx, flow, p.deliveries, cfg.Progress, progress)
	elapsed := time.Since(start)
	cancelWork()
	prodErr := <-prodDone
	if err := router.Close(); err != nil {
		logger.Error("Router close", err, nil)
	}
	<-routerDone

	counts, countErr := ss.ledger.counts(context.WithoutCancel(ctx), cfg.Scope)
	if countErr != nil {
		return summary{}, fmt.Errorf("reading the ledger: %w", countErr)
	}
	sum := summarize(p, prod, counts, &outcomes, flow, &logErrors, elapsed, completed, !cfg.NoIdempotency)
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
		done <- flow.waitFor(ctx, 0, func(t *tracker) bool { return t.done(deliveries) })
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

func summarize(p *plan, prod *producer, counts map[string]int, outcomes *tally, flow *tracker, logErrors *atomic.Int64,
	elapsed time.Duration, completed, idempotent bool) summary {
	fs := flow.state()
	double, lost, doubled := audit(counts, p.commands, p.valid)
	s := summary{
		Published:      prod.commands,
		Deliveries:     fs.published,
		Unique:         len(prod.keysSeen),
		Effects:        totalCharges(counts),
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
		AckedByRouter:  fs.acked + fs.extraAcks,
		AckedByEvents:  outcomes.acked.Load(),
		Outcomes:       map[pipeline.Outcome]int64{},
		Takeovers:      outcomes.takeovers.Load(),
		InProgressKeys: outcomes.contendedKeys(),
		Produced:       fs.produced,
		Settled:        fs.settled,
		SettledUUIDs:   fs.distinctSettlements,
		LogErrors:      logErrors.Load(),
		Faults:         p.counts,
		Idempotent:     idempotent,
	}
	for o := pipeline.OutcomeExecuted; o <= pipeline.OutcomeStoreFailed; o++ {
		s.Outcomes[o] = outcomes.count(o)
	}
	if secs := elapsed.Seconds(); secs > 0 {
		s.MsgsPerSec = float64(s.Deliveries) / secs
	}
	return s
}

// freshNames gives a self-contained run a key space, ledger scope and topics
// of its own where they are shared with other runs: on a shared store
// (postgres, redis) the scope gets a run suffix, and on a real broker the
// topics get a run prefix unless --topic-prefix was given. Otherwise a
// second run would replay the first one's records, or read its leftovers.
func freshNames(cfg config, sharedStore bool) config {
	id := watermill.NewShortUUID()
	if sharedStore {
		cfg.Scope += "-run-" + id
	}
	if cfg.Broker != "gochannel" && cfg.TopicPrefix == "" {
		cfg.TopicPrefix = "oncemill-run-" + id + "-"
	}
	return cfg
}
