package main

// The soak run: the example worker's router and the workload with its
// faults in one process, every delivery followed through the broker, and
// a report of what happened before the example worker's summary line.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/integration/internal/worker"
	"github.com/oncemill/oncemill/pipeline"
)

// summary is what a soak run reports: the example worker's summary and
// what the run saw.
type summary struct {
	worker.Summary

	Commands      int // commands planned (--count)
	Invalid       int // commands that must fail permanently and never be charged
	Planned       int // deliveries planned
	AckedByRouter int // deliveries the handlers acknowledged, as the router saw it, the broker's own redeliveries included
	AckedByEvents int64
	Outcomes      map[pipeline.Outcome]int64
	Takeovers     int64
	ContendedKeys int // keys a delivery found held by another live lease
	Produced      int // settlements returned by handlers
	Settled       int // settlements received on the settlements topic
	SettledUUIDs  int // distinct settlement UUIDs
	LogErrors     int64
	Faults        faultCounts
	Idempotent    bool
}

// problems lists every failed check; none means the run passed. On top of
// the example worker's checks, oncemill's events must count as many
// acknowledged deliveries as the router acknowledged.
func (s *summary) problems() []string {
	out := s.Problems()
	if s.Completed && s.Idempotent && s.AckedByEvents != int64(s.AckedByRouter) {
		out = append(out, fmt.Sprintf("oncemill events report %d acknowledged deliveries but the router acknowledged %d", s.AckedByEvents, s.AckedByRouter))
	}
	return out
}

// write prints the details and, last, the summary line.
func (s *summary) write(w io.Writer) {
	mode := "oncemill"
	if !s.Idempotent {
		mode = "no idempotency (baseline)"
	}
	o, f := s.Outcomes, s.Faults
	fmt.Fprintf(w, "mode: %s, elapsed %v, completed=%t\n", mode, s.Elapsed.Round(time.Millisecond), s.Completed)
	fmt.Fprintf(w, "faults: invalid=%d transient=%d stall=%d redeliver=%d resend=%d concurrent=%d\n",
		f.invalid, f.transient, f.stall, f.redeliver, f.resend, f.concurrent)
	var counts []string
	for oc := pipeline.OutcomeExecuted; oc <= pipeline.OutcomeKeyFailed; oc++ {
		counts = append(counts, fmt.Sprintf("%s=%d", oc, o[oc]))
	}
	fmt.Fprintf(w, "outcomes: %s takeovers=%d contended_keys=%d\n", strings.Join(counts, " "), s.Takeovers, s.ContendedKeys)
	fmt.Fprintf(w, "settlements: produced=%d received=%d distinct=%d; log_errors=%d\n", s.Produced, s.Settled, s.SettledUUIDs, s.LogErrors)
	fmt.Fprintln(w, s.Line())
}

// run executes one workload and returns its summary, which it also writes
// to stdout (the summary line last); nil when the run did not get as far as
// publishing. The error is about the run itself (setup, a publish that
// failed, the timeout); failed checks are in summary.problems.
func run(ctx context.Context, cfg config, stdout, stderr io.Writer) (*summary, error) {
	var logErrors atomic.Int64
	log := worker.NewLogger(cfg.LogLevel, cfg.LogFormat, stderr, &logErrors)
	ss, err := worker.OpenStore(ctx, cfg.Config, log)
	if err != nil {
		return nil, err
	}
	defer ss.Close()
	cfg.Config = worker.FreshNames(cfg.Config, ss.Shared)
	w := cfg.workload()
	hooks := cfg.hooks(w, stdout)
	b, err := worker.OpenBroker(ctx, cfg.Config, hooks, log)
	if err != nil {
		return nil, err
	}
	defer func() { _ = b.Close() }()

	var outcomes tally
	flow := newTracker(cfg.Partitions)
	router, err := worker.NewRouter(cfg.Config, hooks, log, b, ss, worker.RouterOptions{
		OnEvent: outcomes.record,
		// The tracker is outermost: it sees what the router does.
		First:        func(i int) []message.HandlerMiddleware { return []message.HandlerMiddleware{flow.middleware(i)} },
		CloseTimeout: 10 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	tp := worker.Topics{Prefix: cfg.TopicPrefix}
	settleSub, err := b.Subscriber(cfg.ConsumerGroup + "-" + tp.Settlements())
	if err != nil {
		return nil, fmt.Errorf("subscriber of %s: %w", tp.Settlements(), err)
	}
	router.AddConsumerHandler("settlements", tp.Settlements(), settleSub, flow.settle)
	routerDone, err := worker.StartRouter(ctx, router)
	if err != nil {
		return nil, err
	}

	// Publish and wait, both bounded by the timeout.
	start := time.Now()
	workCtx, cancelWork := context.WithTimeoutCause(ctx, cfg.Timeout, fmt.Errorf("timed out after %v", cfg.Timeout))
	defer cancelWork()
	keys, err := worker.NewKeyGenerator(cfg.Key)
	if err != nil {
		return nil, err
	}
	prod := &worker.Producer{
		Plan: w.Plan, Pub: b.Pub, Topics: tp, Partitions: cfg.Partitions, Keys: keys,
		Room: func(ctx context.Context, n int) error {
			flow.waitFor(ctx, 0, func(t *tracker) bool { return t.published-t.acked+n <= cfg.InFlight })
			return ctx.Err()
		},
		Publishing: flow.publishing,
		// Both partitions of a concurrent copy drain first, for up to 2 ms.
		Copies: w.copies(flow, 2*time.Millisecond),
	}
	prodDone := make(chan error, 1)
	go func() { prodDone <- prod.Run(workCtx) }()

	progress := func() {
		fs := flow.state()
		counts, _ := ss.Ledger.Counts(workCtx, cfg.Scope)
		fmt.Fprintf(stderr, "progress: acked=%d / %d in_flight=%d effects=%d replays=%d cached_failures=%d contended_keys=%d takeovers=%d log_errors=%d\n",
			fs.acked, w.deliveries, fs.inFlight, worker.TotalCharges(counts), outcomes.Replays(), outcomes.CachedFailures(),
			outcomes.contendedKeys(), outcomes.takeovers.Load(), logErrors.Load())
	}
	completed := worker.WaitProgress(workCtx, cfg.Progress, progress, func(ctx context.Context) bool {
		return flow.waitFor(ctx, 0, func(t *tracker) bool { return t.done(w.deliveries) })
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
	fs := flow.state()
	sum := &summary{
		Summary: worker.Summary{
			Published:      prod.Commands,
			Deliveries:     fs.published,
			Unique:         len(prod.KeysSeen),
			Effects:        worker.TotalCharges(counts),
			Replays:        outcomes.Replays(),
			CachedFailures: outcomes.CachedFailures(),
			Completed:      completed,
			Elapsed:        elapsed,
		},
		Commands:      len(w.Commands),
		Invalid:       w.Invalids,
		Planned:       w.deliveries,
		AckedByRouter: fs.acked + fs.extraAcks,
		AckedByEvents: outcomes.Acked(),
		Outcomes:      map[pipeline.Outcome]int64{},
		Takeovers:     outcomes.takeovers.Load(),
		ContendedKeys: outcomes.contendedKeys(),
		Produced:      fs.produced,
		Settled:       fs.settled,
		SettledUUIDs:  fs.distinctSettlements,
		LogErrors:     logErrors.Load(),
		Faults:        w.counts,
		Idempotent:    !cfg.NoIdempotency,
	}
	sum.Audit(counts, w.Plan)
	for o := pipeline.OutcomeExecuted; o <= pipeline.OutcomeKeyFailed; o++ {
		sum.Outcomes[o] = outcomes.Count(o)
	}
	sum.write(stdout)

	switch {
	case completed:
		return sum, nil
	case prodErr != nil && !errors.Is(prodErr, context.Canceled) && !errors.Is(prodErr, context.DeadlineExceeded):
		return sum, fmt.Errorf("producer: %w", prodErr)
	default:
		return sum, fmt.Errorf("%w; outstanding: %s", context.Cause(workCtx), outstanding(fs, w.deliveries))
	}
}

// outstanding says what a run that did not complete was still waiting for.
func outstanding(fs flowState, deliveries int) string {
	return fmt.Sprintf("%d of %d deliveries not published, %d published and not acknowledged, %d produced settlements not received",
		deliveries-fs.published, deliveries, fs.published-fs.acked, max(fs.produced-fs.settled, 0))
}
