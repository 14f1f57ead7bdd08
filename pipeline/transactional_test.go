package pipeline_test

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
)

// txChain is the chain in the one-transaction mode over a fakeTxStore, with
// retry and a breaker that opens after one failure.
func txChain(t *testing.T) (*fakeTxStore, pipeline.Chain, chan pipeline.Event) {
	t.Helper()
	st := newFakeTxStore()
	t.Cleanup(func() { _ = st.Close() })
	events := make(chan pipeline.Event, 100)
	p := policy.Policy{}.WithDefaults()
	p.NackDelay, p.AttemptDelay = -1, -1 // no pauses
	var c pipeline.Chain
	var err error
	if c.Idempotency, err = pipeline.NewIdempotency(pipeline.IdempotencyConfig{
		TxStore: st, Keys: keygen.UUID(), Scope: "s", Policy: p, OnEvent: func(e pipeline.Event) { events <- e },
	}); err != nil {
		t.Fatal(err)
	}
	rc := pipeline.RetryConfig{}
	rc.InitialInterval, rc.MaxInterval, rc.Classify = time.Millisecond, 2*time.Millisecond, p.Classify
	if c.Retry, err = pipeline.NewRetry(rc); err != nil {
		t.Fatal(err)
	}
	bc := pipeline.BreakerConfig{}
	bc.Classify, bc.Timeout = p.Classify, time.Hour
	bc.ReadyToTrip = func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 3 }
	if c.Breaker, err = pipeline.NewBreaker(bc); err != nil {
		t.Fatal(err)
	}
	return st, c, events
}

// The claim comes before retry and the breaker: a duplicate is replayed
// from the record even while the circuit is open, and a retry claims again
// in a fresh transaction.
func TestTxModeOrder(t *testing.T) {
	t.Parallel()
	st, c, events := txChain(t)
	var calls atomic.Int32
	fail := atomic.Bool{}
	h := c.Middleware(func(m *message.Message) ([]*message.Message, error) {
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
	if c.Breaker.State() != gobreaker.StateOpen {
		t.Fatalf("breaker %v, want open", c.Breaker.State())
	}
	// A duplicate of the first is replayed while the circuit is open.
	before, requests := calls.Load(), c.Breaker.Counts().Requests
	out, err := h(msg("flaky", "x"))
	if err != nil || len(out) != 1 || out[0].UUID != "out-flaky" {
		t.Fatalf("duplicate under an open circuit = %v, %v; want the replay", out, err)
	}
	if e := <-events; e.Outcome != pipeline.OutcomeReplayed || calls.Load() != before || c.Breaker.Counts().Requests != requests {
		t.Fatalf("outcome %v, calls %d→%d; want a replay that reaches neither the breaker nor the handler", e.Outcome, before, calls.Load())
	}

	// A new key under the open circuit: claimed, refused by the breaker,
	// rolled back by the stage, recorded as retryable, nacked.
	rollbacks, records := st.rollbacks.Load(), st.records.Load()
	if _, err := h(msg("refused", "x")); !errors.Is(err, pipeline.ErrCircuitOpen) {
		t.Fatalf("new key under an open circuit = %v, want ErrCircuitOpen", err)
	}
	if e := <-events; e.Outcome != pipeline.OutcomeReleased {
		t.Fatalf("outcome %v, want released", e.Outcome)
	}
	if st.rollbacks.Load() != rollbacks+1 || st.records.Load() != records+1 {
		t.Fatalf("rollbacks %d→%d records %d→%d; want the claim rolled back and the attempt recorded", rollbacks, st.rollbacks.Load(), records, st.records.Load())
	}
}

// The stage alone (no chain) ends the claim's transaction itself.
func TestTxModeStageAlone(t *testing.T) {
	t.Parallel()
	st := newFakeTxStore()
	t.Cleanup(func() { _ = st.Close() })
	idem, err := pipeline.NewIdempotency(pipeline.IdempotencyConfig{TxStore: st, Keys: keygen.UUID(), Scope: "s", Policy: policy.Policy{}.WithDefaults()})
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
	if _, err := pipeline.NewIdempotency(pipeline.IdempotencyConfig{Store: st, TxStore: st, Keys: keygen.UUID(), Policy: policy.Policy{}.WithDefaults()}); !errors.Is(err, oncemill.ErrInvalidConfig) {
		t.Fatalf("both stores: %v, want ErrInvalidConfig", err)
	}
}
