package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// Without a dead letter, the default (policy.ExhaustedKeep) never acks a
// message whose attempts ran out: the capped attempt and every later one
// nack, each logged at error level; a later attempt that succeeds is
// recorded as usual.
func TestAttemptCapKeepsTheMessageWithoutADeadLetter(t *testing.T) {
	t.Parallel()
	logs, logger := testenv.NewLogs()
	h := newHarness(t, func(c *stageConfig) { c.Policy.MaxAttempts, c.Logger = 2, logger })
	var calls atomic.Int32
	healed := false
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls.Add(1)
		if healed {
			return nil, nil
		}
		return nil, errors.New("ledger database unreachable")
	})
	for i := 1; i <= 3; i++ {
		if _, err := handler(msg("m1", "x")); err == nil {
			t.Fatalf("attempt %d acked: without a dead letter an exhausted message must be nacked", i)
		}
		e := h.last()
		if e.Outcome != pipeline.OutcomeReleased || e.Attempt != i || e.Exhausted != (i >= 2) {
			t.Fatalf("attempt %d: event %+v, want released, Exhausted from attempt 2", i, e)
		}
	}
	rec, err := h.store.Get(context.Background(), "test", "m1")
	if err != nil || rec.Status != store.StatusRetryable || rec.Attempt != 3 {
		t.Fatalf("record %+v, %v: want the key released after attempt 3, nothing cached", rec, err)
	}
	if errs := logs.At(slog.LevelError); len(errs) != 2 || !strings.Contains(errs[0].Msg, "no dead letter") {
		t.Fatalf("error lines %+v, want one per exhausted attempt (2)", errs)
	}
	healed = true
	if _, err := handler(msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 4 {
		t.Fatalf("event %+v, want executed on attempt 4", e)
	}
	if calls.Load() != 4 {
		t.Fatalf("handler ran %d times, want 4", calls.Load())
	}
}

// The pause before the nack of a retryable failure doubles with the
// attempt, ±20%, up to the cap; a negative AttemptDelay means none.
func TestAttemptPauseSchedule(t *testing.T) {
	t.Parallel()
	stage := func(p policy.Policy) *idempotency.Leased {
		s, err := idempotency.NewLeased(newHarness(t, nil).store, idempotency.Config{KeyGenerator: keygen.UUID(), Policy: p})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	s := stage(policy.Policy{AttemptDelay: time.Second, MaxAttemptDelay: 5 * time.Second})
	for attempt, nominal := range map[int]time.Duration{1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 4: 5 * time.Second, 9: 5 * time.Second, 1000: 5 * time.Second} {
		for range 200 {
			if got := idempotency.AttemptPause(s, attempt); got < nominal*8/10 || got > nominal*12/10+time.Nanosecond {
				t.Fatalf("attempt %d: pause %v, want %v ±20%%", attempt, got, nominal)
			}
		}
	}
	if got := idempotency.AttemptPause(stage(policy.Policy{AttemptDelay: -1}), 3); got != 0 {
		t.Fatalf("AttemptDelay -1: pause %v, want none", got)
	}
}

// The default attempts span at least 30 s of a dependency's outage:
// pauses of 3, 6, 12 and 24 s ±20% between the five attempts, 36–54 s in
// all (docs/concepts.md).
func TestDefaultAttemptsSpanTheDocumentedTime(t *testing.T) {
	t.Parallel()
	s, err := idempotency.NewLeased(newHarness(t, nil).store, idempotency.Config{})
	if err != nil {
		t.Fatal(err)
	}
	maxAttempts := policy.Policy{}.WithDefaults().MaxAttempts
	if maxAttempts != 5 {
		t.Fatalf("the default MaxAttempts is %d; docs/concepts.md says 5", maxAttempts)
	}
	for range 1000 {
		var span time.Duration
		for attempt := 1; attempt < maxAttempts; attempt++ {
			span += idempotency.AttemptPause(s, attempt)
		}
		if span < 36*time.Second || span > 54*time.Second+time.Microsecond {
			t.Fatalf("the default attempts span %v, want 36–54 s", span)
		}
	}
}

// A retryable failure is nacked only after its attempt's pause, so that a
// broker that redelivers at once (AMQP) does not spend the attempts in
// milliseconds.
func TestRetryableFailureNacksAfterThePause(t *testing.T) {
	t.Parallel()
	const delay = 40 * time.Millisecond
	h := newHarness(t, func(c *stageConfig) { c.Policy.AttemptDelay, c.Policy.MaxAttempts = delay, 10 })
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("down") })
	for attempt := 1; attempt <= 3; attempt++ {
		start := time.Now()
		if _, err := handler(msg("m1", "x")); err == nil {
			t.Fatal("a retryable failure was acked")
		}
		if least := time.Duration(0.8 * float64(delay<<(attempt-1))); time.Since(start) < least {
			t.Fatalf("attempt %d nacked after %v, want at least %v", attempt, time.Since(start), least)
		}
		if e := h.last(); e.Outcome != pipeline.OutcomeReleased || e.Attempt != attempt {
			t.Fatalf("delivery %d: %v at attempt %d, want released at attempt %d", attempt, e.Outcome, e.Attempt, attempt)
		}
		h.clock.Advance(2 * delay << (attempt - 1)) // the store's clock: past the pause it keeps
	}
}

// completeFails fails Complete while down is set.
type completeFails struct {
	store.Store
	down  atomic.Bool
	tries atomic.Int32
}

func (c *completeFails) Complete(ctx context.Context, l store.Claim, o store.Completion) error {
	c.tries.Add(1)
	if c.down.Load() {
		return errors.New("store unreachable")
	}
	return c.Store.Complete(ctx, l, o)
}

// completionDown is a stage over a store whose Complete fails until told
// otherwise, with the given lease and heartbeat.
func completionDown(t *testing.T, lease, heartbeat time.Duration) (*harness, *completeFails) {
	fails := &completeFails{}
	fails.down.Store(true)
	h := newHarness(t, func(c *stageConfig) {
		fails.Store = c.Store
		c.Store = fails
		c.Policy.LeaseDuration, c.Policy.Heartbeat = lease, heartbeat
	})
	return h, fails
}

// A success whose completion fails is tried again while the lease is
// still held, so a store back within the lease records it: a duplicate then
// replays instead of running again.
func TestCompletionRetriedWhileTheLeaseIsHeld(t *testing.T) {
	t.Parallel()
	h, fails := completionDown(t, 20*time.Second, time.Second)
	var calls atomic.Int32
	handler := h.stage.Middleware(produce(&calls))
	go func() {
		for fails.tries.Load() < 3 {
			time.Sleep(time.Millisecond)
		}
		fails.down.Store(false)
	}()
	if _, err := handler(msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeExecuted || e.Err != nil {
		t.Fatalf("event %+v: the completion must have been recorded", e)
	}
	if _, err := handler(msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeReplayed || calls.Load() != 1 {
		t.Fatalf("duplicate: event %+v, %d runs; want a replay after one run", e, calls.Load())
	}
}

// A store that stays down past the lease: the completion is given up on
// before the lease runs out (a later Complete could not be told from a
// takeover's), and the success is acked with the error in its event.
func TestCompletionGivenUpAsTheLeaseRunsOut(t *testing.T) {
	t.Parallel()
	h, fails := completionDown(t, 400*time.Millisecond, 100*time.Millisecond)
	done := make(chan error, 1)
	go func() { _, err := h.stage.Middleware(produce(new(atomic.Int32)))(msg("m1", "x")); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("a success must be acked, got %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the completion was retried past the lease")
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeExecuted || e.Err == nil || fails.tries.Load() < 2 {
		t.Fatalf("event %+v after %d tries: want executed with the store's error, tried more than once", e, fails.tries.Load())
	}
}

// checkKey marks the context of CheckLease's own Extend.
type checkKey struct{}

// lostDuringCheck answers CheckLease's Extend only when its context ends,
// and the heartbeat's Extend, which starts meanwhile, with a lost lease.
type lostDuringCheck struct {
	store.Store
	checking chan struct{}
}

func (l *lostDuringCheck) Extend(ctx context.Context, lease store.Claim, d time.Duration) (store.Claim, error) {
	if ctx.Value(checkKey{}) != nil {
		close(l.checking)
		<-ctx.Done()
		return store.Claim{}, fmt.Errorf("extend: %w", ctx.Err())
	}
	<-l.checking
	return store.Claim{}, store.ErrLeaseLost
}

// When a heartbeat finds the lease lost while CheckLease's own extend is in
// flight, the heartbeat cancels the handler's context under that extend:
// CheckLease still reports ErrLeaseLost, not the context's cancellation.
func TestCheckLeaseWhileAHeartbeatLosesTheLease(t *testing.T) {
	t.Parallel()
	ls := &lostDuringCheck{checking: make(chan struct{})}
	h := newHarness(t, func(c *stageConfig) {
		ls.Store = c.Store
		c.Store = ls
		c.Policy.LeaseDuration, c.Policy.Heartbeat = time.Second, 50*time.Millisecond
	})
	checked := make(chan error, 1)
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		err := pipeline.CheckLease(context.WithValue(m.Context(), checkKey{}, true))
		checked <- err
		return nil, err
	})
	go func() { _, _ = handler(msg("m1", "x")) }()
	select {
	case err := <-checked:
		if !errors.Is(err, store.ErrLeaseLost) || !strings.Contains(err.Error(), "lease lost while the handler ran") {
			t.Fatalf("CheckLease = %v, want an error wrapping store.ErrLeaseLost that says the lease was lost while the handler ran", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("CheckLease did not return")
	}
}

// lostReply writes the first Complete and then reports it failed, as a cut
// between the commit and its reply does.
type lostReply struct {
	*memory.Store
	tries atomic.Int32
}

func (l *lostReply) Complete(ctx context.Context, lease store.Claim, o store.Completion) error {
	if err := l.Store.Complete(ctx, lease, o); err != nil || l.tries.Add(1) > 1 {
		return err
	}
	return errors.New("connection reset by peer")
}

// A completion retried after a write whose answer was lost finds the lease
// finished by itself, not taken over: the success is recorded, and the
// event says nothing went wrong.
func TestCompletionRetryFindsItsOwnLostWrite(t *testing.T) {
	t.Parallel()
	lr := &lostReply{}
	h := newHarness(t, func(c *stageConfig) {
		lr.Store = c.Store.(*memory.Store)
		c.Store = lr
	})
	if _, err := h.stage.Middleware(produce(new(atomic.Int32)))(msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeExecuted || e.Err != nil || lr.tries.Load() != 1 {
		t.Fatalf("event %+v after %d written completions: want executed without an error", e, lr.tries.Load())
	}
}
