package idempotency_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// The two modes of the stage, for the tests that run in both.
const (
	leaseMode = "lease"
	txMode    = "one-transaction"
)

var bothModes = []string{leaseMode, txMode}

// chainHarness is one stage with every option set (validation, retry, a
// circuit breaker, a dead letter), in either mode, over one fakeTxStore (in
// the lease mode used as the plain memory store it is), recording events.
type chainHarness struct {
	mode       string
	st         *fakeTxStore
	middleware message.HandlerMiddleware
	dlq        <-chan *message.Message
	events     chan pipeline.Event
	mu         sync.Mutex
	state      gobreaker.State
}

type chainOptions struct {
	mode        string
	validate    func(*message.Message) error
	maxAttempts int
	tripAfter   uint32
	// requests, when set, counts the requests the breaker lets through
	// (its IsSuccessful calls, which judge the policy's way).
	requests *atomic.Int32
}

func newChainHarness(t *testing.T, o chainOptions) *chainHarness {
	t.Helper()
	h := &chainHarness{mode: o.mode, st: newFakeTxStore(), events: make(chan pipeline.Event, 100), state: gobreaker.StateClosed}
	t.Cleanup(func() { _ = h.st.Close() })
	p := policy.Policy{}.WithDefaults()
	p.NackDelay, p.AttemptDelay = -1, -1 // no pauses
	if o.maxAttempts > 0 {
		p.MaxAttempts = o.maxAttempts
	}
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 100}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })
	var err error
	if h.dlq, err = pubSub.Subscribe(context.Background(), "dead"); err != nil {
		t.Fatal(err)
	}
	breaker := &gobreaker.Settings{
		Timeout: time.Hour,
		OnStateChange: func(_ string, _, to gobreaker.State) {
			h.mu.Lock()
			h.state = to
			h.mu.Unlock()
		},
	}
	if o.tripAfter > 0 {
		breaker.ReadyToTrip = func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= o.tripAfter }
	}
	if o.requests != nil {
		breaker.IsSuccessful = func(err error) bool {
			o.requests.Add(1)
			return err == nil || p.Classify(err) == policy.ClassCached
		}
	}
	cfg := idempotency.Config{
		KeyGenerator:        keygen.UUID(),
		Scope:               "s",
		Policy:              p,
		EventHandler:        func(e pipeline.Event) { h.events <- e },
		Validation:          o.validate,
		Retry:               &pipeline.RetryConfig{InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond},
		CircuitBreaker:      breaker,
		DeadLetterPublisher: pubSub,
		DeadLetterTopic:     "dead",
	}
	switch o.mode {
	case leaseMode:
		stage, err := idempotency.NewLeased(h.st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		h.middleware = stage.Middleware
	case txMode:
		cfg.Policy.LeaseDuration, cfg.Policy.Heartbeat = 0, 0 // refused in this mode
		stage, err := idempotency.NewTransactional(h.st, cfg)
		if err != nil {
			t.Fatal(err)
		}
		h.middleware = stage.Middleware
	default:
		t.Fatalf("mode %q", o.mode)
	}
	return h
}

// breakerState is the state the breaker last changed to.
func (h *chainHarness) breakerState() gobreaker.State {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.state
}

func (h *chainHarness) event(t *testing.T) pipeline.Event {
	t.Helper()
	select {
	case e := <-h.events:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event")
		return pipeline.Event{}
	}
}

func settle(calls *atomic.Int32) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		return []*message.Message{message.NewMessage("settled-"+m.UUID, []byte("ok"))}, nil
	}
}

// Order: a stored result ends the work before retry, breaker and (in the
// one-transaction mode) the handler's transaction; none of them sees the
// duplicate.
func TestChainStoredResultBypassesRetryBreakerAndTransaction(t *testing.T) {
	t.Parallel()
	for _, mode := range bothModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var requests atomic.Int32
			h := newChainHarness(t, chainOptions{mode: mode, requests: &requests})
			var calls atomic.Int32
			handler := h.middleware(settle(&calls))
			first, err := handler(msg("m1", "x"))
			if err != nil || len(first) != 1 {
				t.Fatalf("first: %v %v", first, err)
			}
			_ = h.event(t)
			before := requests.Load()
			if before != 1 {
				t.Fatalf("the first delivery made %d breaker requests, want 1", before)
			}
			for i := 0; i < 3; i++ {
				out, err := handler(msg("m1", "x"))
				if err != nil || len(out) != 1 || out[0].UUID != "settled-m1" {
					t.Fatalf("duplicate %d: %v %v", i, out, err)
				}
				if e := h.event(t); e.Outcome != pipeline.OutcomeReplayed {
					t.Fatalf("duplicate %d: %v", i, e.Outcome)
				}
			}
			if calls.Load() != 1 || requests.Load() != before {
				t.Fatalf("handler %d, breaker requests %d→%d: duplicates must not reach them", calls.Load(), before, requests.Load())
			}
			if mode == txMode && (h.st.txs.Load() != 1 || h.st.commits.Load() != 1 || h.st.rollbacks.Load() != 0) {
				t.Fatalf("%d transactions, %d commits, %d rollbacks: a duplicate must open no transaction",
					h.st.txs.Load(), h.st.commits.Load(), h.st.rollbacks.Load())
			}
		})
	}
}

// Order: with the circuit open, a duplicate with a stored result is still
// replayed, while a new message gets a retryable error and no handler call.
func TestChainOpenBreakerStillReplaysStoredResults(t *testing.T) {
	t.Parallel()
	for _, mode := range bothModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := newChainHarness(t, chainOptions{mode: mode, tripAfter: 1})
			var calls atomic.Int32
			down := errors.New("payment gateway unreachable")
			handler := h.middleware(func(m *message.Message) ([]*message.Message, error) {
				calls.Add(1)
				if m.UUID == "broken" {
					return nil, down
				}
				return []*message.Message{message.NewMessage("settled-"+m.UUID, nil)}, nil
			})
			if _, err := handler(msg("m1", "x")); err != nil {
				t.Fatal(err)
			}
			_ = h.event(t)
			// The first try fails and trips the breaker; retry stops at the
			// open circuit instead of hammering it, with the handler's error:
			// that attempt ran.
			if _, err := handler(msg("broken", "x")); !errors.Is(err, down) || errors.Is(err, pipeline.ErrCircuitOpen) {
				t.Fatalf("the failing delivery: %v, want the handler's error, stopped at the open circuit", err)
			}
			if e := h.event(t); e.Outcome != pipeline.OutcomeReleased || e.Attempt != 1 {
				t.Fatalf("the failing delivery: %v at attempt %d, want released at attempt 1", e.Outcome, e.Attempt)
			}
			if s := h.breakerState(); s != gobreaker.StateOpen {
				t.Fatalf("breaker %v, want open", s)
			}
			before, txs := calls.Load(), h.st.txs.Load()
			out, err := handler(msg("m1", "x"))
			if err != nil || len(out) != 1 || out[0].UUID != "settled-m1" {
				t.Fatalf("duplicate with the circuit open: %v %v, want the stored message", out, err)
			}
			if e := h.event(t); e.Outcome != pipeline.OutcomeReplayed {
				t.Fatalf("duplicate: %v", e.Outcome)
			}
			if h.st.txs.Load() != txs {
				t.Fatal("the duplicate opened a transaction")
			}
			// The refused delivery waits for the circuit (an hour here: its
			// context ends the wait) and spends no attempt.
			m2 := msg("m2", "x")
			ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
			defer cancel()
			m2.SetContext(ctx)
			_, err = handler(m2)
			if !errors.Is(err, pipeline.ErrCircuitOpen) || ((policy.Policy{}).Classify(err) == policy.ClassCached) {
				t.Fatalf("new message with the circuit open: %v, want retryable ErrCircuitOpen", err)
			}
			if e := h.event(t); e.Outcome != pipeline.OutcomeHeldBack {
				t.Fatalf("new message: %v, want held back for redelivery", e.Outcome)
			}
			if rec, err := h.st.Get(t.Context(), "s", "m2"); err != nil || rec.Attempt != 0 || rec.RetryAt.IsZero() {
				t.Fatalf("record of the refused delivery = %+v, %v; want attempt 0, held back", rec, err)
			}
			if calls.Load() != before {
				t.Fatalf("handler ran %d more times with the circuit open", calls.Load()-before)
			}
		})
	}
}

// Order: an invalid message never reaches the store; it is acked, counted
// and dead-lettered once.
func TestChainInvalidMessageNeverReachesTheStore(t *testing.T) {
	t.Parallel()
	errNoAmount := errors.New("amount is missing")
	for _, mode := range bothModes {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			h := newChainHarness(t, chainOptions{mode: mode, validate: func(m *message.Message) error {
				if !strings.Contains(string(m.Payload), "amount") {
					return errNoAmount
				}
				return nil
			}})
			var calls atomic.Int32
			out, err := h.middleware(settle(&calls))(msg("m1", `{"currency":"EUR"}`))
			if err != nil || out != nil {
				t.Fatalf("invalid message: %v %v, want an ack", out, err)
			}
			e := h.event(t)
			if e.Outcome != pipeline.OutcomeInvalid || !errors.Is(e.Err, errNoAmount) || !errors.Is(e.Err, pipeline.ErrInvalidMessage) {
				t.Fatalf("event %+v", e)
			}
			if _, err := h.st.Get(context.Background(), "s", "m1"); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("store has a record for an invalid message: %v", err)
			}
			if calls.Load() != 0 || h.st.claims.Load() != 0 || h.st.txs.Load() != 0 {
				t.Fatal("an invalid message reached the handler, or was claimed")
			}
			dead := <-h.dlq
			dead.Ack()
			if dead.UUID != "m1" || pipeline.DeadLetterReason(dead.Metadata.Get(pipeline.ReasonKindKey)) != pipeline.DeadLetterReasonInvalid ||
				!strings.Contains(dead.Metadata.Get(middleware.ReasonForPoisonedKey), "amount is missing") {
				t.Fatalf("dead letter %s %v", dead.UUID, dead.Metadata)
			}
		})
	}
}

// Order: when retry gives up, the stage classifies the last error by the
// policy.
func TestChainRetryExhaustionIsClassifiedByThePolicy(t *testing.T) {
	t.Parallel()
	flaky := policy.Retryable(errors.New("timeout"))
	for _, mode := range bothModes {
		t.Run(mode+": retryable: released for redelivery", func(t *testing.T) {
			t.Parallel()
			h := newChainHarness(t, chainOptions{mode: mode})
			var calls atomic.Int32
			_, err := h.middleware(func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, flaky })(msg("m1", "x"))
			if !errors.Is(err, flaky) || !strings.Contains(err.Error(), "gave up after 3 tries") {
				t.Fatalf("got %v", err)
			}
			if e := h.event(t); e.Outcome != pipeline.OutcomeReleased || calls.Load() != 3 {
				t.Fatalf("outcome %v, %d calls; want released after 3 tries", e.Outcome, calls.Load())
			}
			if mode == txMode && (h.st.txs.Load() != 3 || h.st.rollbacks.Load() != 3) {
				t.Fatalf("%d transactions, %d rollbacks; want each try in its own transaction, rolled back", h.st.txs.Load(), h.st.rollbacks.Load())
			}
			if rec, err := h.st.Get(context.Background(), "s", "m1"); err != nil || rec.Status != store.StatusRetryable {
				t.Fatalf("record %+v %v, want the key released", rec, err)
			}
		})
		t.Run(mode+": retryable at the attempt cap: cached", func(t *testing.T) {
			t.Parallel()
			h := newChainHarness(t, chainOptions{mode: mode, maxAttempts: 1})
			_, err := h.middleware(func(*message.Message) ([]*message.Message, error) { return nil, flaky })(msg("m1", "x"))
			if err != nil {
				t.Fatalf("got %v, want an ack", err)
			}
			if e := h.event(t); e.Outcome != pipeline.OutcomeCachedFailure {
				t.Fatalf("outcome %v", e.Outcome)
			}
			rec, _ := h.st.Get(context.Background(), "s", "m1")
			if rec.ErrorKind != store.ErrorKindAttemptsExhausted {
				t.Fatalf("error kind %q", rec.ErrorKind)
			}
		})
		t.Run(mode+": permanent: not retried, cached, dead-lettered", func(t *testing.T) {
			t.Parallel()
			h := newChainHarness(t, chainOptions{mode: mode})
			var calls atomic.Int32
			_, err := h.middleware(func(*message.Message) ([]*message.Message, error) {
				calls.Add(1)
				return nil, policy.Cached(errors.New("card declined"))
			})(msg("m1", "x"))
			if err != nil || calls.Load() != 1 {
				t.Fatalf("got %v after %d calls, want an ack after 1", err, calls.Load())
			}
			if e := h.event(t); e.Outcome != pipeline.OutcomeCachedFailure {
				t.Fatalf("outcome %v", e.Outcome)
			}
			if rec, err := h.st.Get(context.Background(), "s", "m1"); err != nil || rec.Status != store.StatusCachedFailure || rec.ErrorKind != store.ErrorKindCached {
				t.Fatalf("record %+v %v, want the cached failure", rec, err)
			}
			dead := <-h.dlq
			dead.Ack()
			if pipeline.DeadLetterReason(dead.Metadata.Get(pipeline.ReasonKindKey)) != pipeline.DeadLetterReasonCachedFailure {
				t.Fatalf("dead letter reason %v", dead.Metadata)
			}
		})
	}
}

// In the one-transaction mode a rolled back attempt leaves no record
// marked Succeeded, and a success is recorded by its commit alone.
func TestChainRollbackLeavesNoSucceededRecord(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		failCommit bool
		handler    message.HandlerFunc
	}{
		{"handler error", false, func(*message.Message) ([]*message.Message, error) { return nil, errors.New("insert failed") }},
		{"handler panic", false, func(*message.Message) ([]*message.Message, error) { panic("nil map") }},
		// A failed commit has rolled back already (as in pgx): no Rollback call.
		{"commit fails", true, func(*message.Message) ([]*message.Message, error) { return nil, nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newChainHarness(t, chainOptions{mode: txMode})
			h.st.failCommit.Store(tc.failCommit)
			if _, err := h.middleware(tc.handler)(msg("m1", "x")); err == nil {
				t.Fatal("want a nack")
			}
			if e := h.event(t); e.Outcome != pipeline.OutcomeReleased {
				t.Fatalf("outcome %v, want released", e.Outcome)
			}
			rec, err := h.st.Get(context.Background(), "s", "m1")
			if err != nil || rec.Status == store.StatusSucceeded {
				t.Fatalf("record %v %v: a rolled back attempt must not be succeeded", rec.Status, err)
			}
			wantRollbacks := h.st.txs.Load()
			if tc.failCommit {
				wantRollbacks = 0
			}
			if h.st.txs.Load() != 3 || h.st.commits.Load() != 0 || h.st.rollbacks.Load() != wantRollbacks {
				t.Fatalf("%d transactions, %d commits, %d rollbacks; want 3 tries, none committed", h.st.txs.Load(), h.st.commits.Load(), h.st.rollbacks.Load())
			}
		})
	}
	t.Run("success is recorded by the commit", func(t *testing.T) {
		t.Parallel()
		h := newChainHarness(t, chainOptions{mode: txMode})
		var calls atomic.Int32
		if _, err := h.middleware(settle(&calls))(msg("m1", "x")); err != nil {
			t.Fatal(err)
		}
		rec, err := h.st.Get(context.Background(), "s", "m1")
		if err != nil || rec.Status != store.StatusSucceeded {
			t.Fatalf("record %v %v", rec.Status, err)
		}
		if h.st.commits.Load() != 1 || h.st.records.Load() != 0 || h.st.rollbacks.Load() != 0 {
			t.Fatalf("%d commits, %d separate records, %d rollbacks: the one-transaction mode records the success once, with the commit",
				h.st.commits.Load(), h.st.records.Load(), h.st.rollbacks.Load())
		}
	})
}
