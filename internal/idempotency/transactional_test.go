package idempotency_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// txPolicy is the default policy without what the one-transaction mode
// refuses (the lease and its heartbeat), and without pauses.
func txPolicy() policy.Policy {
	p := policy.Policy{}.WithDefaults()
	p.LeaseDuration, p.Heartbeat = 0, 0
	p.NackDelay, p.AttemptDelay = -1, -1
	return p
}

// txStage is the one-transaction mode over a fakeTxStore, with retry and a
// breaker that opens after three failures; breakerRequests counts the
// requests the breaker lets through, state is its last state.
type txStage struct {
	st              *fakeTxStore
	handler         func(message.HandlerFunc) message.HandlerFunc
	events          chan pipeline.Event
	breakerRequests atomic.Int32
	state           atomic.Int32 // a gobreaker.State
}

func newTxStage(t *testing.T) *txStage {
	t.Helper()
	s := &txStage{st: newFakeTxStore(), events: make(chan pipeline.Event, 100)}
	t.Cleanup(func() { _ = s.st.Close() })
	p := txPolicy()
	stage, err := idempotency.NewTransactional(s.st, idempotency.Config{
		KeyGenerator: keygen.UUID(), Scope: "s", Policy: p, EventHandler: func(e pipeline.Event) { s.events <- e },
		Retry: &pipeline.RetryConfig{InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond},
		CircuitBreaker: &gobreaker.Settings{
			Timeout:     time.Hour,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 3 },
			IsSuccessful: func(err error) bool {
				s.breakerRequests.Add(1)
				return err == nil || p.Classify(err) == policy.ClassCached
			},
			OnStateChange: func(_ string, _, to gobreaker.State) { s.state.Store(int32(to)) },
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	s.handler = stage.Middleware
	return s
}

// The claim comes before retry and the breaker: a duplicate is replayed
// from the record even while the circuit is open, and a retry claims again
// in a fresh transaction.
func TestTxModeOrder(t *testing.T) {
	t.Parallel()
	s := newTxStage(t)
	st, events := s.st, s.events
	var calls atomic.Int32
	fail := atomic.Bool{}
	h := s.handler(func(m *message.Message) ([]*message.Message, error) {
		calls.Add(1)
		if m.UUID == "flaky" && calls.Load() == 1 {
			return nil, errors.New("transient")
		}
		if fail.Load() {
			return nil, errors.New("down")
		}
		return []*message.Message{message.NewMessage("out-"+m.UUID, nil)}, nil
	})

	// A retry claims again: two claims, one rollback, one commit.
	if _, err := h(msg("flaky", "x")); err != nil {
		t.Fatal(err)
	}
	<-events
	if st.claims.Load() != 2 || st.rollbacks.Load() != 1 || st.commits.Load() != 1 || calls.Load() != 2 {
		t.Fatalf("claims %d rollbacks %d commits %d calls %d; want 2, 1, 1, 2", st.claims.Load(), st.rollbacks.Load(), st.commits.Load(), calls.Load())
	}

	// Open the circuit: a new key fails three tries in one delivery.
	fail.Store(true)
	if _, err := h(msg("broken", "x")); err == nil {
		t.Fatal("want a nack")
	}
	if e := <-events; e.Outcome != pipeline.OutcomeReleased {
		t.Fatalf("outcome %v, want released", e.Outcome)
	}
	if gobreaker.State(s.state.Load()) != gobreaker.StateOpen {
		t.Fatalf("breaker %v, want open", gobreaker.State(s.state.Load()))
	}
	// A duplicate of the first is replayed while the circuit is open.
	before, requests, txs := calls.Load(), s.breakerRequests.Load(), st.txs.Load()
	out, err := h(msg("flaky", "x"))
	if err != nil || len(out) != 1 || out[0].UUID != "out-flaky" {
		t.Fatalf("duplicate under an open circuit = %v, %v; want the replay", out, err)
	}
	if e := <-events; e.Outcome != pipeline.OutcomeReplayed || calls.Load() != before || s.breakerRequests.Load() != requests || st.txs.Load() != txs {
		t.Fatalf("outcome %v, calls %d→%d, transactions %d→%d; want a replay that reaches neither the breaker nor the handler, and opens no transaction",
			e.Outcome, before, calls.Load(), txs, st.txs.Load())
	}

	// A new key under the open circuit: claimed, refused by the breaker,
	// rolled back by the stage, recorded as retryable without spending the
	// attempt, nacked after the circuit's pause (cut short here by the
	// message's context).
	rollbacks, records := st.rollbacks.Load(), st.records.Load()
	refused := msg("refused", "x")
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	refused.SetContext(ctx)
	if _, err := h(refused); !errors.Is(err, pipeline.ErrCircuitOpen) {
		t.Fatalf("new key under an open circuit = %v, want ErrCircuitOpen", err)
	}
	if e := <-events; e.Outcome != pipeline.OutcomeHeldBack {
		t.Fatalf("outcome %v, want held back", e.Outcome)
	}
	if st.rollbacks.Load() != rollbacks+1 || st.records.Load() != records+1 || calls.Load() != before {
		t.Fatalf("rollbacks %d→%d records %d→%d calls %d→%d; want the claim rolled back, the attempt recorded, the handler not run",
			rollbacks, st.rollbacks.Load(), records, st.records.Load(), before, calls.Load())
	}
}

// The stage alone (no retry, no breaker) ends the claim's transaction
// itself: a commit after a success, a rollback after an error or a panic
// (which comes back as Watermill's RecoveredPanicError).
func TestTxModeStageAlone(t *testing.T) {
	t.Parallel()
	st := newFakeTxStore()
	t.Cleanup(func() { _ = st.Close() })
	idem, err := idempotency.NewTransactional(st, idempotency.Config{KeyGenerator: keygen.UUID(), Scope: "s", Policy: txPolicy()})
	if err != nil {
		t.Fatal(err)
	}
	var sawTx bool
	h := idem.Middleware(func(m *message.Message) ([]*message.Message, error) {
		_, sawTx = m.Context().Value(fakeTxKey{}).(*fakeClaimTx)
		return nil, nil
	})
	if _, err := h(msg("m1", "x")); err != nil || !sawTx || st.commits.Load() != 1 {
		t.Fatalf("err %v, handler saw its transaction %v, commits %d", err, sawTx, st.commits.Load())
	}
	if _, err := idem.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("x") })(msg("m2", "x")); err == nil || st.rollbacks.Load() != 1 {
		t.Fatalf("failure: %v, rollbacks %d", err, st.rollbacks.Load())
	}
	_, err = idem.Middleware(func(*message.Message) ([]*message.Message, error) { panic("boom") })(msg("m3", "x"))
	var rp middleware.RecoveredPanicError
	if !errors.As(err, &rp) || rp.V != "boom" || st.rollbacks.Load() != 2 || st.commits.Load() != 1 {
		t.Fatalf("panic: %v, rollbacks %d commits %d; want a RecoveredPanicError after a rollback", err, st.rollbacks.Load(), st.commits.Load())
	}
}

// NewTransactional refuses a nil store, and the lease settings that have
// no effect in its mode, naming each.
func TestNewTransactionalRefusesBadConfig(t *testing.T) {
	t.Parallel()
	st := newFakeTxStore()
	t.Cleanup(func() { _ = st.Close() })
	for name, tc := range map[string]struct {
		st      store.Transactional
		policy  policy.Policy
		setting string
	}{
		"no store":  {nil, txPolicy(), "NewTransactional"},
		"lease":     {st, policy.Policy{LeaseDuration: time.Minute}, "WithPolicy(Policy.LeaseDuration)"},
		"heartbeat": {st, policy.Policy{Heartbeat: time.Second}, "WithPolicy(Policy.Heartbeat)"},
		"defaults":  {st, policy.Policy{}.WithDefaults(), "WithPolicy(Policy.LeaseDuration)"},
	} {
		var ce *oncemill.ConfigError
		if _, err := idempotency.NewTransactional(tc.st, idempotency.Config{Policy: tc.policy}); !errors.Is(err, oncemill.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Setting != tc.setting {
			t.Errorf("%s: got %v, want a ConfigError for %s", name, err, tc.setting)
		}
	}
	if _, err := idempotency.NewTransactional(st, idempotency.Config{}); err != nil {
		t.Errorf("the zero Config: %v", err)
	}
}
