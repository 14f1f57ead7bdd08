package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/storetest"
)

var errDeclined = errors.New("card declined")

// stageConfig is what a lease-mode stage is made of, for a test to change
// before it is made: the store and the Config.
type stageConfig struct {
	Store store.Store
	idempotency.Config
}

// harness is one lease-mode stage over a memory store with a manual clock,
// recording every event.
type harness struct {
	t      *testing.T
	store  *memory.Store
	clock  *storetest.Clock
	stage  *idempotency.Leased
	mu     sync.Mutex
	events []pipeline.Event
}

func newHarness(t *testing.T, mutate func(*stageConfig)) *harness {
	t.Helper()
	h := &harness{t: t, clock: storetest.NewClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))}
	st, err := memory.New(memory.Options{Now: h.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	h.store = st
	cfg := stageConfig{Store: st, Config: idempotency.Config{
		KeyGenerator: keygen.UUID(),
		Scope:        "test",
		Policy:       policy.Policy{}.WithDefaults(),
		EventHandler: func(e pipeline.Event) {
			h.mu.Lock()
			h.events = append(h.events, e)
			h.mu.Unlock()
		},
	}}
	cfg.Policy.NackDelay, cfg.Policy.AttemptDelay = -1, -1 // no pauses
	if mutate != nil {
		mutate(&cfg)
	}
	h.stage, err = idempotency.NewLeased(cfg.Store, cfg.Config)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (h *harness) last() pipeline.Event {
	h.t.Helper()
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.events) == 0 {
		h.t.Fatal("no event recorded")
	}
	return h.events[len(h.events)-1]
}

func (h *harness) outcomes() []pipeline.Outcome {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]pipeline.Outcome, len(h.events))
	for i, e := range h.events {
		out[i] = e.Outcome
	}
	return out
}

func msg(uuid, payload string) *message.Message {
	return message.NewMessage(uuid, []byte(payload))
}

// produce returns a handler that counts its calls and produces one message.
func produce(calls *atomic.Int32) message.HandlerFunc {
	return func(m *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		out := message.NewMessage("out-"+m.UUID, []byte("settled:"+string(m.Payload)))
		out.Metadata.Set("source", m.UUID)
		return []*message.Message{out}, nil
	}
}

func TestExecuteStoresProducedMessagesAndReplayReturnsThem(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	var calls atomic.Int32
	handler := h.stage.Middleware(produce(&calls))

	first, err := handler(msg("m1", `{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeExecuted || e.Decision != store.DecisionExecute || e.Attempt != 1 || e.Token <= 0 {
		t.Fatalf("first delivery: %+v", e)
	}

	again, err := handler(msg("m1", `{"a":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeReplayed || e.Decision != store.DecisionReplay {
		t.Fatalf("duplicate: %+v", e)
	}
	if len(first) != 1 || len(again) != 1 {
		t.Fatalf("produced %d then replayed %d messages, want 1 and 1", len(first), len(again))
	}
	if !first[0].Equals(again[0]) || again[0].UUID != "out-m1" || again[0].Metadata.Get("source") != "m1" {
		t.Fatalf("replayed %+v, want the stored %+v with the same UUID", again[0], first[0])
	}
}

func TestCachedFailureIsAckedAndNotRerun(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	var calls atomic.Int32
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls.Add(1)
		return nil, policy.Cached(errDeclined)
	})
	for i := 0; i < 3; i++ {
		if out, err := handler(msg("m1", "x")); err != nil || out != nil {
			t.Fatalf("delivery %d: (%v, %v), want an ack", i, out, err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
	got := h.outcomes()
	want := []pipeline.Outcome{pipeline.OutcomeCachedFailure, pipeline.OutcomeCachedFailureReplayed, pipeline.OutcomeCachedFailureReplayed}
	if !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	rec, err := h.store.Get(context.Background(), "test", "m1")
	if err != nil || rec.Status != store.StatusCachedFailure || rec.ErrorKind != store.ErrorKindCached || !strings.Contains(rec.ErrorMessage, "card declined") {
		t.Fatalf("record %+v, %v", rec, err)
	}
	if err := h.last().Err; err == nil || !strings.Contains(err.Error(), "card declined") || !((policy.Policy{}).Classify(err) == policy.ClassCached) {
		t.Fatalf("replayed failure event carries %v, want the cached permanent failure", err)
	}
}

func TestCachedErrorsByErrorsIs(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) { c.Policy.CachedErrors = []error{errDeclined} })
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, errors.Join(errors.New("charging"), errDeclined)
	})
	if _, err := handler(msg("m1", "x")); err != nil {
		t.Fatalf("a cached failure must be acked, got %v", err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeCachedFailure || !errors.Is(e.Err, errDeclined) {
		t.Fatalf("event %+v", e)
	}
}

func TestRetryableFailureReleasesAndNacks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	transient := errors.New("gateway timeout")
	var calls atomic.Int32
	var attempts []int
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		lease, ok := pipeline.ClaimFromContext(m.Context())
		if !ok {
			t.Error("no lease in the handler context")
		}
		attempts = append(attempts, lease.Attempt)
		if calls.Add(1) == 1 {
			return nil, transient
		}
		return nil, nil
	})
	if _, err := handler(msg("m1", "x")); !errors.Is(err, transient) {
		t.Fatalf("retryable failure must nack with the handler's error, got %v", err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeReleased {
		t.Fatalf("event %+v", e)
	}
	rec, err := h.store.Get(context.Background(), "test", "m1")
	if err != nil || rec.Status != store.StatusRetryable || rec.Attempt != 1 {
		t.Fatalf("released record %+v, %v", rec, err)
	}
	if _, err := handler(msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 2 || !slices.Equal(attempts, []int{1, 2}) {
		t.Fatalf("calls %d attempts %v, want 2 calls with attempts [1 2]", calls.Load(), attempts)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 2 {
		t.Fatalf("event %+v", e)
	}
}

// Under policy.ExhaustedDrop, without a dead letter, the attempt that
// reaches the cap caches the failure and acks, and says so at error level.
func TestAttemptCapDropsUnderExhaustedDrop(t *testing.T) {
	t.Parallel()
	logs, logger := testenv.NewLogs()
	h := newHarness(t, func(c *stageConfig) {
		c.Policy.MaxAttempts, c.Policy.Exhausted, c.Logger = 3, policy.ExhaustedDrop, logger
	})
	var calls atomic.Int32
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls.Add(1)
		return nil, policy.Retryable(errors.New("still down"))
	})
	for i := 1; i <= 2; i++ {
		if _, err := handler(msg("m1", "x")); err == nil {
			t.Fatalf("attempt %d under the cap must nack", i)
		}
	}
	if _, err := handler(msg("m1", "x")); err != nil {
		t.Fatalf("the attempt that reaches the cap must be acked, got %v", err)
	}
	if _, err := handler(msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 3 {
		t.Fatalf("handler ran %d times, want 3", calls.Load())
	}
	want := []pipeline.Outcome{pipeline.OutcomeReleased, pipeline.OutcomeReleased, pipeline.OutcomeCachedFailure, pipeline.OutcomeCachedFailureReplayed}
	if got := h.outcomes(); !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	rec, _ := h.store.Get(context.Background(), "test", "m1")
	if rec.ErrorKind != store.ErrorKindAttemptsExhausted {
		t.Fatalf("error kind %q, want %q", rec.ErrorKind, store.ErrorKindAttemptsExhausted)
	}
	if e := h.events[2]; !e.Exhausted {
		t.Fatalf("the capped attempt's event %+v must say Exhausted", e)
	}
	if errs := logs.At(slog.LevelError); len(errs) != 1 || !strings.Contains(errs[0].Msg, "DROPPED") {
		t.Fatalf("error lines %+v, want one saying the message was dropped", errs)
	}
}

func TestInProgressWaitsThenReplays(t *testing.T) {
	t.Parallel()
	signal := &contendedSignal{inProgress: make(chan struct{}, 1)}
	h := newHarness(t, func(c *stageConfig) {
		c.Policy.HeldKeyTimeout = time.Minute
		signal.Store = c.Store
		c.Store = signal
	})
	started, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		close(started)
		<-release
		return []*message.Message{msg("out-1", "done")}, nil
	})
	firstDone := make(chan error, 1)
	go func() { _, err := handler(msg("m1", "x")); firstDone <- err }()
	<-started

	dupDone := make(chan []*message.Message, 1)
	go func() {
		out, err := handler(msg("m1", "x"))
		if err != nil {
			t.Errorf("waiting duplicate: %v", err)
		}
		dupDone <- out
	}()
	<-signal.inProgress // the duplicate found the key in progress
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatal(err)
	}
	out := <-dupDone
	if calls.Load() != 1 || len(out) != 1 || out[0].UUID != "out-1" {
		t.Fatalf("calls %d, duplicate got %v; want 1 call and the replayed out-1", calls.Load(), out)
	}
	h.mu.Lock()
	events := slices.Clone(h.events)
	h.mu.Unlock()
	// The two events may arrive in either order: each is reported after
	// its delivery's last store call.
	slices.SortFunc(events, func(a, b pipeline.Event) int { return int(a.Outcome) - int(b.Outcome) })
	if len(events) != 2 {
		t.Fatalf("%d events, want 2", len(events))
	}
	if first := events[0]; first.Outcome != pipeline.OutcomeExecuted || first.Contended {
		t.Errorf("first delivery's event %+v, want executed and not contended", first)
	}
	if dup := events[1]; dup.Outcome != pipeline.OutcomeReplayed || dup.Decision != store.DecisionReplay || !dup.Contended {
		t.Errorf("duplicate's event %+v, want replayed after finding the key in progress (Contended)", dup)
	}
}

func TestInProgressPastTheBoundNacks(t *testing.T) {
	t.Parallel()
	for _, mode := range []policy.HeldKeyMode{policy.HeldKeyWait, policy.HeldKeyNack} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *stageConfig) {
				c.Policy.HeldKey = mode
				c.Policy.HeldKeyTimeout = 30 * time.Millisecond
				c.Policy.NackDelay = 10 * time.Millisecond
			})
			if _, err := h.store.ClaimLease(context.Background(), store.LeaseRequest{Scope: "test", Key: "m1", LeaseDuration: time.Hour}); err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int32
			_, err := h.stage.Middleware(produce(&calls))(msg("m1", "x"))
			if !errors.Is(err, pipeline.ErrKeyHeld) {
				t.Fatalf("got %v, want ErrKeyHeld (a nack)", err)
			}
			if e := h.last(); e.Outcome != pipeline.OutcomeHeldKeyNacked || e.Decision != store.DecisionHeld || !e.Contended || calls.Load() != 0 {
				t.Fatalf("event %+v, calls %d", e, calls.Load())
			}
		})
	}
}

func TestInProgressRejectAcksAsPermanent(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) { c.Policy.HeldKey = policy.HeldKeyReject })
	if _, err := h.store.ClaimLease(context.Background(), store.LeaseRequest{Scope: "test", Key: "m1", LeaseDuration: time.Hour}); err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	if _, err := h.stage.Middleware(produce(&calls))(msg("m1", "x")); err != nil {
		t.Fatalf("reject must ack, got %v", err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeRejected || !errors.Is(e.Err, pipeline.ErrDuplicateRejected) || calls.Load() != 0 {
		t.Fatalf("event %+v calls %d", e, calls.Load())
	}
}

func TestMismatchIsPermanentAndNeverRuns(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	var calls atomic.Int32
	handler := h.stage.Middleware(produce(&calls))
	if _, err := handler(msg("m1", `{"amount":1}`)); err != nil {
		t.Fatal(err)
	}
	out, err := handler(msg("m1", `{"amount":2}`))
	if err != nil || out != nil {
		t.Fatalf("mismatch must be acked with nothing produced, got (%v, %v)", out, err)
	}
	e := h.last()
	if e.Outcome != pipeline.OutcomeRejected || e.Decision != store.DecisionMismatch || !errors.Is(e.Err, pipeline.ErrMismatch) || !((policy.Policy{}).Classify(e.Err) == policy.ClassCached) {
		t.Fatalf("event %+v", e)
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times, want 1", calls.Load())
	}
}

func TestWithoutFingerprintTreatsAChangedPayloadAsDuplicate(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) { c.Fingerprint = func(*message.Message) string { return "" } })
	var calls atomic.Int32
	handler := h.stage.Middleware(produce(&calls))
	_, _ = handler(msg("m1", `{"amount":1}`))
	_, _ = handler(msg("m1", `{"amount":2}`))
	if e := h.last(); e.Outcome != pipeline.OutcomeReplayed || calls.Load() != 1 {
		t.Fatalf("event %+v calls %d", e, calls.Load())
	}
}

func TestMissingKey(t *testing.T) {
	t.Parallel()
	t.Run("fails permanently by default", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, nil)
		var calls atomic.Int32
		if _, err := h.stage.Middleware(produce(&calls))(msg("", "x")); err != nil {
			t.Fatalf("missing key must be acked, got %v", err)
		}
		e := h.last()
		if e.Outcome != pipeline.OutcomeRejected || !errors.Is(e.Err, keygen.ErrEmptyKey) || !errors.Is(e.Err, keygen.ErrNoKey) || calls.Load() != 0 {
			t.Fatalf("event %+v calls %d", e, calls.Load())
		}
	})
	t.Run("empty key from a function", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, func(c *stageConfig) {
			c.KeyGenerator = keygen.Func(func(*message.Message) (string, error) { return "", nil })
		})
		var calls atomic.Int32
		_, _ = h.stage.Middleware(produce(&calls))(msg("m1", "x"))
		if e := h.last(); e.Outcome != pipeline.OutcomeRejected || !errors.Is(e.Err, keygen.ErrEmptyKey) || calls.Load() != 0 {
			t.Fatalf("event %+v calls %d", e, calls.Load())
		}
	})
	t.Run("execute unguarded", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, func(c *stageConfig) { c.Policy.MissingKey = policy.MissingKeyRunUnguarded })
		var calls atomic.Int32
		out, err := h.stage.Middleware(produce(&calls))(msg("", "x"))
		if err != nil || len(out) != 1 || calls.Load() != 1 {
			t.Fatalf("unguarded run: (%v, %v), calls %d", out, err, calls.Load())
		}
		if e := h.last(); e.Outcome != pipeline.OutcomeUnguarded || !errors.Is(e.Err, keygen.ErrEmptyKey) {
			t.Fatalf("event %+v", e)
		}
	})
}

func TestPanicReleasesTheKeyLikeRecoverer(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	var calls atomic.Int32
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			panic("boom")
		}
		return nil, nil
	})
	_, err := handler(msg("m1", "x"))
	var rp middleware.RecoveredPanicError
	if !errors.As(err, &rp) || rp.V != "boom" || !strings.Contains(rp.Stacktrace, "TestPanicReleasesTheKeyLikeRecoverer") {
		t.Fatalf("got %v, want a RecoveredPanicError with the stack", err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeReleased {
		t.Fatalf("event %+v", e)
	}
	if _, err := handler(msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 2 {
		t.Fatalf("redelivery after a panic: %+v", e)
	}
}

func TestPayloadTooLargeIsRejected(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) { c.Policy.MaxPayloadBytes = 10 })
	var calls atomic.Int32
	if _, err := h.stage.Middleware(produce(&calls))(msg("m1", "0123456789ab")); err != nil {
		t.Fatal(err)
	}
	e := h.last()
	if e.Outcome != pipeline.OutcomeRejected || !errors.Is(e.Err, pipeline.ErrPayloadTooLarge) || !strings.Contains(e.Err.Error(), "12 bytes, limit 10") || calls.Load() != 0 {
		t.Fatalf("event %+v calls %d", e, calls.Load())
	}
}

func TestResultTooLargeIsRememberedWithoutMessages(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) { c.Policy.MaxResultBytes = 16 })
	var calls atomic.Int32
	handler := h.stage.Middleware(produce(&calls))
	first, err := handler(msg("m1", "a payload long enough to overflow"))
	if err != nil || len(first) != 1 {
		t.Fatalf("first delivery must still return its messages: (%v, %v)", first, err)
	}
	again, err := handler(msg("m1", "a payload long enough to overflow"))
	if err != nil || len(again) != 0 || calls.Load() != 1 {
		t.Fatalf("duplicate: (%v, %v) calls %d; want an ack with nothing to replay", again, err, calls.Load())
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeReplayed {
		t.Fatalf("event %+v", e)
	}
}

func TestLeaseLostCancelsTheHandler(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) {
		c.Policy.LeaseDuration = time.Minute
		c.Policy.Heartbeat = 5 * time.Millisecond // real time; the lease runs on the manual clock
	})
	started := make(chan struct{})
	var cause error
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		close(started)
		<-m.Context().Done()
		cause = context.Cause(m.Context())
		return nil, m.Context().Err()
	})
	done := make(chan error, 1)
	go func() { _, err := handler(msg("m1", "x")); done <- err }()
	<-started
	h.clock.Advance(2 * time.Minute)
	res, err := h.store.ClaimLease(context.Background(), store.LeaseRequest{Scope: "test", Key: "m1", Fingerprint: keygen.PayloadFingerprint(msg("m1", "x")), LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute || !res.Takeover {
		t.Fatalf("takeover: %+v %v", res, err)
	}
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("handler returned %v, want its canceled context error", err)
	}
	if !errors.Is(cause, store.ErrLeaseLost) || !strings.Contains(cause.Error(), "lease lost while the handler ran") {
		t.Fatalf("cancel cause %v, want store.ErrLeaseLost, lost while the handler ran", cause)
	}
}

func TestHeartbeatKeepsTheLease(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) {
		c.Policy.LeaseDuration = time.Minute
		c.Policy.Heartbeat = 5 * time.Millisecond
	})
	started, release := make(chan struct{}), make(chan struct{})
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		close(started)
		<-release
		return nil, m.Context().Err()
	})
	done := make(chan error, 1)
	go func() { _, err := handler(msg("m1", "x")); done <- err }()
	<-started
	// Move the manual clock past the original lease in small steps, letting
	// real heartbeats extend it between steps.
	for i := 0; i < 10; i++ {
		h.clock.Advance(20 * time.Second)
		testenv.WaitFor(t, 10*time.Second, "a heartbeat to extend the lease past the advanced clock", func() bool {
			rec, err := h.store.Get(context.Background(), "test", "m1")
			return err == nil && rec.LeaseExpiresAt.After(h.clock.Now().Add(50*time.Second))
		})
	}
	res, err := h.store.ClaimLease(context.Background(), store.LeaseRequest{Scope: "test", Key: "m1", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionHeld {
		t.Fatalf("after 200s of store time the heartbeat must still hold the lease: %+v %v", res, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("handler saw %v", err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeExecuted {
		t.Fatalf("event %+v", e)
	}
}

// failingStore fails the operations named in fail, and delegates the rest.
type failingStore struct {
	store.Store
	failBegin, failComplete bool
}

var errStoreDown = errors.New("connection refused")

func (f *failingStore) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if f.failBegin {
		return store.ClaimResult{}, errStoreDown
	}
	return f.Store.ClaimLease(ctx, req)
}

func (f *failingStore) Complete(ctx context.Context, l store.Claim, o store.Completion) error {
	if f.failComplete {
		return errStoreDown
	}
	return f.Store.Complete(ctx, l, o)
}

func TestStoreDownOnBeginNacks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) { c.Store = &failingStore{Store: c.Store, failBegin: true} })
	var calls atomic.Int32
	_, err := h.stage.Middleware(produce(&calls))(msg("m1", "x"))
	if !errors.Is(err, errStoreDown) || calls.Load() != 0 {
		t.Fatalf("got %v calls %d, want a nack wrapping the store error and no run", err, calls.Load())
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeStoreFailed || e.Outcome.Acked() {
		t.Fatalf("event %+v", e)
	}
}

func TestStoreDownOnCompleteStillAcksTheEffect(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) {
		c.Store = &failingStore{Store: c.Store, failComplete: true}
		// The completion is retried while the lease is held: keep it short.
		c.Policy.LeaseDuration, c.Policy.Heartbeat = 500*time.Millisecond, 100*time.Millisecond
	})
	var calls atomic.Int32
	out, err := h.stage.Middleware(produce(&calls))(msg("m1", "x"))
	if err != nil || len(out) != 1 {
		t.Fatalf("got (%v, %v), want the produced message and an ack", out, err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeExecuted || !errors.Is(e.Err, errStoreDown) {
		t.Fatalf("event %+v", e)
	}
}

func TestStoreDownWhenCachingAFailureNacks(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) {
		c.Store = &failingStore{Store: c.Store, failComplete: true}
		// The completion is retried while the lease is held: keep it short.
		c.Policy.LeaseDuration, c.Policy.Heartbeat = 500*time.Millisecond, 100*time.Millisecond
	})
	_, err := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, policy.Cached(errDeclined)
	})(msg("m1", "x"))
	if !errors.Is(err, errStoreDown) {
		t.Fatalf("an unrecorded permanent failure must be nacked, got %v", err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeStoreFailed {
		t.Fatalf("event %+v", e)
	}
}

func TestLongKeysAreHashedToTheStoreLimit(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	long := strings.Repeat("k", h.store.Limits().MaxKeyLen+1)
	var calls atomic.Int32
	if _, err := h.stage.Middleware(produce(&calls))(msg(long, "x")); err != nil {
		t.Fatal(err)
	}
	e := h.last()
	if e.Outcome != pipeline.OutcomeExecuted || e.Key != keygen.StorableKey(long, h.store.Limits().MaxKeyLen) || len(e.Key) > h.store.Limits().MaxKeyLen {
		t.Fatalf("event key %q (len %d)", e.Key, len(e.Key))
	}
}

// limitedStore is a store with other limits.
type limitedStore struct {
	store.Store
	limits store.Limits
}

func (l limitedStore) Limits() store.Limits { return l.limits }

// Every setting NewLeased refuses is named in its ConfigError; a nil
// KeyGenerator is not one of them: it means keygen.UUID().
func TestNewLeasedRefusesBadConfig(t *testing.T) {
	t.Parallel()
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	for name, tc := range map[string]struct {
		st      store.Store
		cfg     idempotency.Config
		setting string
	}{
		"no store":          {nil, idempotency.Config{}, "New"},
		"bad policy":        {st, idempotency.Config{Policy: policy.Policy{LeaseDuration: -1}}, "WithPolicy(Policy.LeaseDuration)"},
		"bad scope":         {st, idempotency.Config{Scope: "a\x00b"}, "WithScope"},
		"topic without pub": {st, idempotency.Config{DeadLetterTopic: "dead"}, "WithDeadLetter"},
		"result over limit": {limitedStore{st, store.Limits{MaxResultBytes: 100}}, idempotency.Config{Policy: policy.Policy{MaxResultBytes: 101}}, "WithPolicy(Policy.MaxResultBytes)"},
		"bad retry":         {st, idempotency.Config{Retry: &pipeline.RetryConfig{MaxTries: -1}}, "WithRetry(RetryConfig.MaxTries)"},
	} {
		var ce *oncemill.ConfigError
		if _, err := idempotency.NewLeased(tc.st, tc.cfg); !errors.Is(err, oncemill.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Setting != tc.setting {
			t.Errorf("%s: got %v, want a ConfigError for %s", name, err, tc.setting)
		}
	}
	stage, err := idempotency.NewLeased(st, idempotency.Config{Scope: "s"})
	if err != nil {
		t.Fatalf("the zero Config (nil KeyGenerator) is the defaults, got %v", err)
	}
	var calls atomic.Int32
	handler := stage.Middleware(produce(&calls))
	for range 2 {
		if _, err := handler(msg("m1", "x")); err != nil {
			t.Fatal(err)
		}
	}
	if calls.Load() != 1 {
		t.Fatalf("handler ran %d times for two deliveries of one UUID: a nil KeyGenerator must guard by UUID", calls.Load())
	}
}

func TestCheckLease(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	if err := pipeline.CheckLease(context.Background()); err != nil {
		t.Fatalf("outside a handler CheckLease must be a no-op, got %v", err)
	}
	started, checked := make(chan struct{}), make(chan error, 2)
	proceed := make(chan struct{})
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		checked <- pipeline.CheckLease(m.Context())
		close(started)
		<-proceed
		err := pipeline.CheckLease(m.Context())
		checked <- err
		return nil, err
	})
	done := make(chan error, 1)
	go func() { _, err := handler(msg("m1", "x")); done <- err }()
	<-started
	if err := <-checked; err != nil {
		t.Fatalf("lease held: CheckLease = %v", err)
	}
	// The worker "pauses" past its lease and another delivery takes over.
	h.clock.Advance(time.Hour)
	if res, err := h.store.ClaimLease(context.Background(), store.LeaseRequest{Scope: "test", Key: "m1", Fingerprint: keygen.PayloadFingerprint(msg("m1", "x")), LeaseDuration: time.Minute}); err != nil || !res.Takeover {
		t.Fatalf("takeover: %+v %v", res, err)
	}
	close(proceed)
	if err := <-checked; !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("after a takeover CheckLease = %v, want store.ErrLeaseLost", err)
	}
	<-done
}

func TestHandlerContextFollowsTheMessageContext(t *testing.T) {
	t.Parallel()
	h := newHarness(t, nil)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, "router value"))
	m := msg("m1", "x")
	m.SetContext(ctx)
	var seen any
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		seen = m.Context().Value(ctxKey{})
		cancel() // the router shuts down while the handler runs
		<-m.Context().Done()
		return nil, m.Context().Err()
	})
	if _, err := handler(m); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want the canceled context's error", err)
	}
	if seen != "router value" {
		t.Fatalf("handler context lost the message context's values: %v", seen)
	}
	if m.Context() != ctx {
		t.Fatal("the message context must be restored after the handler")
	}
	// The release after the canceled handler still reached the store.
	if rec, err := h.store.Get(context.Background(), "test", "m1"); err != nil || rec.Status != store.StatusRetryable {
		t.Fatalf("record %+v %v, want released despite the canceled context", rec, err)
	}
}

type ctxKey struct{}

// Only a message without a key is a missing key. Any other error of the key
// generator is classified by the policy: a transient one nacks and the
// message comes back; it is never run unguarded.
func TestKeyGeneratorErrorsAreClassified(t *testing.T) {
	t.Parallel()
	down := errors.New("lookup service down")
	for _, tt := range []struct {
		name    string
		err     error
		missing policy.MissingKeyMode
		nack    bool
		outcome pipeline.Outcome
	}{
		{"transient", policy.Retryable(down), policy.MissingKeyReject, true, pipeline.OutcomeKeyFailed},
		{"transient, even with MissingKeyRunUnguarded", policy.Retryable(down), policy.MissingKeyRunUnguarded, true, pipeline.OutcomeKeyFailed},
		{"unclassified (retryable by default)", down, policy.MissingKeyRunUnguarded, true, pipeline.OutcomeKeyFailed},
		{"permanent", policy.Cached(down), policy.MissingKeyRunUnguarded, false, pipeline.OutcomeRejected},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *stageConfig) {
				c.KeyGenerator = keygen.Func(func(*message.Message) (string, error) { return "", tt.err })
				c.Policy.MissingKey = tt.missing
			})
			var calls atomic.Int32
			_, err := h.stage.Middleware(produce(&calls))(msg("m1", "x"))
			if nacked := err != nil; nacked != tt.nack || (tt.nack && !errors.Is(err, down)) {
				t.Fatalf("delivery = %v, want nacked %v wrapping the generator's error", err, tt.nack)
			}
			e := h.last()
			if e.Outcome != tt.outcome || e.Outcome.Acked() == tt.nack || !errors.Is(e.Err, down) || calls.Load() != 0 {
				t.Fatalf("event %v (%v), handler calls %d; want %v and no call", e.Outcome, e.Err, calls.Load(), tt.outcome)
			}
		})
	}
}

// slowExtend is a store whose Extend answers after delay.
type slowExtend struct {
	store.Store
	delay time.Duration
}

func (s slowExtend) Extend(ctx context.Context, l store.Claim, d time.Duration) (store.Claim, error) {
	select {
	case <-time.After(s.delay):
		return s.Store.Extend(ctx, l, d)
	case <-ctx.Done():
		return store.Claim{}, ctx.Err()
	}
}

// A heartbeat keeps the lease for as long as the store answers within the
// lease, even when it answers slower than the heartbeat interval: no
// duplicate takes the key over while the handler runs.
func TestHeartbeatKeepsTheLeaseOnASlowStore(t *testing.T) {
	st, err := memory.New(memory.Options{}) // the real clock
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	p := policy.Policy{}.WithDefaults()
	p.LeaseDuration, p.Heartbeat = time.Second, 200*time.Millisecond
	p.HeldKey, p.NackDelay = policy.HeldKeyNack, -1
	stage, err := idempotency.NewLeased(
		slowExtend{Store: st, delay: 400 * time.Millisecond}, // slower than a beat, within the lease
		idempotency.Config{KeyGenerator: keygen.UUID(), Scope: "s", Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	var calls atomic.Int32
	h := stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			<-release
		}
		return nil, nil
	})
	first := make(chan error, 1)
	go func() { _, err := h(msg("m1", "x")); first <- err }()
	for range 12 { // three lease lengths
		time.Sleep(250 * time.Millisecond)
		if _, err := h(msg("m1", "x")); !errors.Is(err, pipeline.ErrKeyHeld) {
			close(release)
			t.Fatalf("a duplicate while the first runs = %v, want ErrKeyHeld (the lease was lost; %d runs)", err, calls.Load())
		}
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 1 {
		t.Fatalf("the handler ran %d times", calls.Load())
	}
}

// refusingStore refuses every ClaimLease as an invalid request.
type refusingStore struct{ store.Store }

func (refusingStore) ClaimLease(context.Context, store.LeaseRequest) (store.ClaimResult, error) {
	return store.ClaimResult{}, fmt.Errorf("refused: %w", store.ErrInvalidRequest)
}

// A request the store refuses as such would be refused on every delivery:
// it is rejected (acked), not nacked forever.
func TestStoreRefusingTheRequestRejects(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) { c.Store = refusingStore{c.Store} })
	var calls atomic.Int32
	if _, err := h.stage.Middleware(produce(&calls))(msg("m1", "x")); err != nil {
		t.Fatalf("delivery = %v, want an ack", err)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeRejected || !errors.Is(e.Err, store.ErrInvalidRequest) || calls.Load() != 0 {
		t.Fatalf("event %v (%v), calls %d; want rejected, not run", e.Outcome, e.Err, calls.Load())
	}
}

// A handler name that some store cannot hold is hashed into the scope.
func TestUnstorableHandlerNameIsHashed(t *testing.T) {
	t.Parallel()
	var scopes []string
	var mu sync.Mutex
	h := newHarness(t, func(c *stageConfig) {
		c.Scope = ""
		c.EventHandler = func(e pipeline.Event) { mu.Lock(); scopes = append(scopes, e.Scope); mu.Unlock() }
	})
	rr := newRouterRun(t)
	handler := rr.router.AddConsumerHandler("handler\x00name", "in", rr.pubSub, func(*message.Message) error { return nil })
	handler.AddMiddleware(h.stage.Middleware)
	rr.start()
	rr.publish("in", msg("m1", "x"))
	rr.waitAcks(1)
	mu.Lock()
	defer mu.Unlock()
	if len(scopes) != 1 || scopes[0] != keygen.StorableKey("handler\x00name", store.MaxScopeLen) {
		t.Fatalf("scopes %q, want the hashed handler name", scopes)
	}
}

// failingBegin fails every ClaimLease while down is set.
type failingBegin struct {
	store.Store
	down *atomic.Bool
}

func (f failingBegin) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if f.down.Load() {
		return store.ClaimResult{}, errors.New("connection refused")
	}
	return f.Store.ClaimLease(ctx, req)
}

// While the store keeps failing, the pause before each nack grows, so a
// broker that redelivers at once does not spin; an answer from the store
// starts it again.
func TestStoreFailurePauseGrows(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	down.Store(true)
	const nackDelay = 20 * time.Millisecond
	h := newHarness(t, func(c *stageConfig) {
		c.Store = failingBegin{Store: c.Store, down: &down}
		c.Policy.NackDelay = nackDelay
	})
	handler := h.stage.Middleware(produce(new(atomic.Int32)))
	deliver := func() time.Duration {
		start := time.Now()
		if _, err := handler(msg("m1", "x")); err == nil {
			t.Fatal("a delivery the store could not decide was acked")
		}
		if e := h.last(); e.Outcome != pipeline.OutcomeStoreFailed {
			t.Fatalf("outcome %v, want store_failed", e.Outcome)
		}
		return time.Since(start)
	}
	for i := range 4 {
		// At least NackDelay × 2^i, less 20% jitter.
		if least := time.Duration(0.8 * float64(nackDelay<<i)); deliver() < least {
			t.Fatalf("failure %d in a row paused less than %v", i+1, least)
		}
	}
	down.Store(false)
	if _, err := handler(msg("m2", "x")); err != nil {
		t.Fatal(err)
	}
	if n := idempotency.StoreFailuresInARow(h.stage); n != 0 {
		t.Fatalf("%d failures in a row after the store answered, want 0", n)
	}
}
