package pipeline_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// chainHarness is every stage over one store, recording events.
type chainHarness struct {
	st     *txStore
	tm     *fakeTxManager
	chain  pipeline.Chain
	dlq    <-chan *message.Message
	events chan pipeline.Event
}

type chainOptions struct {
	validate    func(*message.Message) error
	maxAttempts int
	tripAfter   uint32
}

func newChainHarness(t *testing.T, o chainOptions) *chainHarness {
	t.Helper()
	h := &chainHarness{st: newTxStore(), tm: &fakeTxManager{}, events: make(chan pipeline.Event, 100)}
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
	dl, err := pipeline.NewDeadLetter(pubSub, "dead")
	if err != nil {
		t.Fatal(err)
	}
	onEvent := func(e pipeline.Event) { h.events <- e }
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	h.chain.Idempotency, err = pipeline.NewIdempotency(pipeline.IdempotencyConfig{
		Store: h.st, Keys: keygen.UUID(), Scope: "s", Policy: p, OnEvent: onEvent, DeadLetter: dl,
	})
	must(err)
	validate := o.validate
	if validate == nil {
		validate = func(*message.Message) error { return nil }
	}
	h.chain.Validation, err = pipeline.NewValidation(pipeline.ValidationConfig{Validate: validate, DeadLetter: dl, OnEvent: onEvent})
	must(err)
	rc := pipeline.RetryConfig{}
	rc.InitialInterval, rc.MaxInterval, rc.Classify = time.Millisecond, 2*time.Millisecond, p.Classify
	h.chain.Retry, err = pipeline.NewRetry(rc)
	must(err)
	bc := pipeline.BreakerConfig{}
	bc.Classify, bc.Timeout = p.Classify, time.Hour
	if o.tripAfter > 0 {
		bc.ReadyToTrip = func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= o.tripAfter }
	}
	h.chain.Breaker, err = pipeline.NewBreaker(bc)
	must(err)
	h.chain.Transaction, err = pipeline.NewTransaction(h.tm)
	must(err)
	return h
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

// Order: a stored result ends the work before retry, breaker and
// transaction; none of them sees the duplicate.
func TestChainStoredResultBypassesRetryBreakerAndTransaction(t *testing.T) {
	t.Parallel()
	h := newChainHarness(t, chainOptions{})
	var calls atomic.Int32
	handler := h.chain.Middleware(settle(&calls))
	first, err := handler(msg("m1", "x"))
	if err != nil || len(first) != 1 {
		t.Fatalf("first: %v %v", first, err)
	}
	_ = h.event(t)
	requests := h.chain.Breaker.Counts().Requests
	for i := 0; i < 3; i++ {
		out, err := handler(msg("m1", "x"))
		if err != nil || len(out) != 1 || out[0].UUID != "settled-m1" {
			t.Fatalf("duplicate %d: %v %v", i, out, err)
		}
		if e := h.event(t); e.Outcome != pipeline.OutcomeReplayed {
			t.Fatalf("duplicate %d: %v", i, e.Outcome)
		}
	}
	if calls.Load() != 1 || h.tm.begins.Load() != 1 || h.chain.Breaker.Counts().Requests != requests {
		t.Fatalf("handler %d, transactions %d, breaker requests %d→%d: duplicates must not reach them",
			calls.Load(), h.tm.begins.Load(), requests, h.chain.Breaker.Counts().Requests)
	}
}

// Order: with the circuit open, a duplicate with a stored result is still
// replayed, while a new message gets a retryable error and no handler call.
func TestChainOpenBreakerStillReplaysStoredResults(t *testing.T) {
	t.Parallel()
	h := newChainHarness(t, chainOptions{tripAfter: 1})
	var calls atomic.Int32
	down := errors.New("payment gateway unreachable")
	handler := h.chain.Middleware(func(m *message.Message) ([]*message.Message, error) {
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
	// The first try fails and trips the breaker; the retry stage stops at
	// the open circuit instead of hammering it.
	if _, err := handler(msg("broken", "x")); !errors.Is(err, pipeline.ErrCircuitOpen) {
		t.Fatalf("the failing delivery: %v, want it handed back at the open circuit", err)
	}
	_ = h.event(t)
	if h.chain.Breaker.State() != gobreaker.StateOpen {
		t.Fatalf("breaker %v, want open", h.chain.Breaker.State())
	}
	before := calls.Load()
	out, err := handler(msg("m1", "x"))
	if err != nil || len(out) != 1 || out[0].UUID != "settled-m1" {
		t.Fatalf("duplicate with the circuit open: %v %v, want the stored message", out, err)
	}
	if e := h.event(t); e.Outcome != pipeline.OutcomeReplayed {
		t.Fatalf("duplicate: %v", e.Outcome)
	}
	_, err = handler(msg("m2", "x"))
	if !errors.Is(err, pipeline.ErrCircuitOpen) || ((policy.Policy{}).Classify(err) == policy.ClassCached) {
		t.Fatalf("new message with the circuit open: %v, want retryable ErrCircuitOpen", err)
	}
	if e := h.event(t); e.Outcome != pipeline.OutcomeReleased {
		t.Fatalf("new message: %v, want released for redelivery", e.Outcome)
	}
	if calls.Load() != before {
		t.Fatalf("handler ran %d more times with the circuit open", calls.Load()-before)
	}
}

// Order: an invalid message never reaches the store; it is acked, counted
// and dead-lettered once.
func TestChainInvalidMessageNeverReachesTheStore(t *testing.T) {
	t.Parallel()
	errNoAmount := errors.New("amount is missing")
	h := newChainHarness(t, chainOptions{validate: func(m *message.Message) error {
		if !strings.Contains(string(m.Payload), "amount") {
			return errNoAmount
		}
		return nil
	}})
	var calls atomic.Int32
	out, err := h.chain.Middleware(settle(&calls))(msg("m1", `{"currency":"EUR"}`))
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
	if calls.Load() != 0 || h.tm.begins.Load() != 0 {
		t.Fatal("an invalid message reached the handler or opened a transaction")
	}
	dead := <-h.dlq
	dead.Ack()
	if dead.UUID != "m1" || pipeline.DeadLetterReason(dead.Metadata.Get(pipeline.ReasonKindKey)) != pipeline.DeadLetterReasonInvalid ||
		!strings.Contains(dead.Metadata.Get(middleware.ReasonForPoisonedKey), "amount is missing") {
		t.Fatalf("dead letter %s %v", dead.UUID, dead.Metadata)
	}
}

// Order: when retry gives up, the idempotency stage classifies the last
// error by the policy.
func TestChainRetryExhaustionIsClassifiedByThePolicy(t *testing.T) {
	t.Parallel()
	flaky := policy.Retryable(errors.New("timeout"))
	t.Run("retryable: released for redelivery", func(t *testing.T) {
		t.Parallel()
		h := newChainHarness(t, chainOptions{})
		var calls atomic.Int32
		_, err := h.chain.Middleware(func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, flaky })(msg("m1", "x"))
		if !errors.Is(err, flaky) || !strings.Contains(err.Error(), "gave up after 3 tries") {
			t.Fatalf("got %v", err)
		}
		if e := h.event(t); e.Outcome != pipeline.OutcomeReleased || calls.Load() != 3 || h.tm.begins.Load() != 3 {
			t.Fatalf("outcome %v, %d calls, %d transactions; want released after 3 tries, each in its own transaction", e.Outcome, calls.Load(), h.tm.begins.Load())
		}
	})
	t.Run("retryable at the attempt cap: cached", func(t *testing.T) {
		t.Parallel()
		h := newChainHarness(t, chainOptions{maxAttempts: 1})
		_, err := h.chain.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, flaky })(msg("m1", "x"))
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
	t.Run("permanent: not retried, cached, dead-lettered", func(t *testing.T) {
		t.Parallel()
		h := newChainHarness(t, chainOptions{})
		var calls atomic.Int32
		_, err := h.chain.Middleware(func(*message.Message) ([]*message.Message, error) {
			calls.Add(1)
			return nil, policy.Cached(errors.New("card declined"))
		})(msg("m1", "x"))
		if err != nil || calls.Load() != 1 {
			t.Fatalf("got %v after %d calls, want an ack after 1", err, calls.Load())
		}
		if e := h.event(t); e.Outcome != pipeline.OutcomeCachedFailure {
			t.Fatalf("outcome %v", e.Outcome)
		}
		dead := <-h.dlq
		dead.Ack()
		if pipeline.DeadLetterReason(dead.Metadata.Get(pipeline.ReasonKindKey)) != pipeline.DeadLetterReasonCachedFailure {
			t.Fatalf("dead letter reason %v", dead.Metadata)
		}
	})
}

// Order: a rollback leaves no record marked Succeeded.
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
			h := newChainHarness(t, chainOptions{})
			h.tm.failCommit.Store(tc.failCommit)
			if _, err := h.chain.Middleware(tc.handler)(msg("m1", "x")); err == nil {
				t.Fatal("want a nack")
			}
			if e := h.event(t); e.Outcome != pipeline.OutcomeReleased {
				t.Fatalf("outcome %v, want released", e.Outcome)
			}
			rec, err := h.st.Get(context.Background(), "s", "m1")
			if err != nil || rec.Status == store.StatusSucceeded {
				t.Fatalf("record %v %v: a rolled back attempt must not be succeeded", rec.Status, err)
			}
			wantRollbacks := h.tm.begins.Load()
			if tc.failCommit {
				wantRollbacks = 0
			}
			if h.tm.commits.Load() != 0 || h.tm.rollbacks.Load() != wantRollbacks {
				t.Fatalf("%d begins, %d commits, %d rollbacks", h.tm.begins.Load(), h.tm.commits.Load(), h.tm.rollbacks.Load())
			}
		})
	}
	t.Run("success is recorded after the commit", func(t *testing.T) {
		t.Parallel()
		h := newChainHarness(t, chainOptions{})
		var calls atomic.Int32
		if _, err := h.chain.Middleware(settle(&calls))(msg("m1", "x")); err != nil {
			t.Fatal(err)
		}
		rec, err := h.st.Get(context.Background(), "s", "m1")
		if err != nil || rec.Status != store.StatusSucceeded {
			t.Fatalf("record %v %v", rec.Status, err)
		}
		if h.st.completes.Load() != 1 || h.tm.commits.Load() != 1 {
			t.Fatalf("%d completes, %d commits: the lease mode records the success once, after the commit",
				h.st.completes.Load(), h.tm.commits.Load())
		}
	})
}
