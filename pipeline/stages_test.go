package pipeline_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

func fastRetry(t *testing.T, mutate func(*pipeline.RetryConfig)) *pipeline.Retry {
	t.Helper()
	rc := pipeline.RetryConfig{}
	rc.InitialInterval, rc.MaxInterval = time.Millisecond, 2*time.Millisecond
	if mutate != nil {
		mutate(&rc)
	}
	r, err := pipeline.NewRetry(rc)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRetryRetriesOnlyRetryableErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		err       error
		wantCalls int32
	}{
		{"retryable", errors.New("timeout"), 3},
		{"permanent", policy.Cached(errors.New("declined")), 1},
		{"lease lost", fmt.Errorf("oncemill: lease lost while the handler ran: %w", store.ErrLeaseLost), 1},
		{"circuit open", pipeline.ErrCircuitOpen, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var calls atomic.Int32
			_, err := fastRetry(t, nil).Middleware(func(*message.Message) ([]*message.Message, error) {
				calls.Add(1)
				return nil, tc.err
			})(msg("m1", "x"))
			if !errors.Is(err, tc.err) || calls.Load() != tc.wantCalls {
				t.Fatalf("got %v after %d calls, want the error after %d", err, calls.Load(), tc.wantCalls)
			}
		})
	}
}

func TestRetrySucceedsAfterTransientFailures(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	var waits []time.Duration
	r := fastRetry(t, func(rc *pipeline.RetryConfig) {
		rc.MaxTries = 5
		rc.OnRetry = func(try int, err error, wait time.Duration) { waits = append(waits, wait) }
	})
	out, err := r.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) < 3 {
			return nil, errors.New("timeout")
		}
		return []*message.Message{msg("out", "")}, nil
	})(msg("m1", "x"))
	if err != nil || len(out) != 1 || calls.Load() != 3 || len(waits) != 2 {
		t.Fatalf("out %v err %v calls %d waits %v", out, err, calls.Load(), waits)
	}
}

func TestRetryStopsWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	r := fastRetry(t, func(rc *pipeline.RetryConfig) {
		rc.InitialInterval, rc.MaxInterval, rc.MaxElapsedTime, rc.MaxTries = time.Hour, time.Hour, 2*time.Hour, 10
	})
	ctx, cancel := context.WithCancel(context.Background())
	m := msg("m1", "x")
	m.SetContext(ctx)
	timeout := errors.New("timeout")
	done := make(chan error, 1)
	go func() {
		_, err := r.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, timeout })(m)
		done <- err
	}()
	time.Sleep(10 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, timeout) || !errors.Is(err, context.Canceled) {
			t.Fatalf("got %v, want the handler's last error and the cancellation", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("retry did not stop when the context ended")
	}
}

func TestRetryStopsAtMaxElapsedTime(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	r := fastRetry(t, func(rc *pipeline.RetryConfig) {
		rc.InitialInterval, rc.MaxInterval, rc.MaxElapsedTime, rc.MaxTries = time.Minute, time.Minute, time.Second, 10
	})
	_, err := r.Middleware(func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, errors.New("x") })(msg("m1", "x"))
	if err == nil || calls.Load() != 1 {
		t.Fatalf("a first wait past MaxElapsedTime must give up at once: %v after %d calls", err, calls.Load())
	}
}

// Inside the idempotency stage the heartbeat runs while retry waits.
func TestRetryKeepsTheLeaseAliveWhileItWaits(t *testing.T) {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	counting := &countingStore{Store: st}
	p := policy.Policy{}.WithDefaults()
	p.LeaseDuration, p.Heartbeat = time.Minute, 5*time.Millisecond
	stage, err := pipeline.NewIdempotency(pipeline.IdempotencyConfig{Store: counting, Keys: keygen.UUID(), Scope: "s", Policy: p})
	if err != nil {
		t.Fatal(err)
	}
	r := fastRetry(t, func(rc *pipeline.RetryConfig) {
		rc.InitialInterval, rc.MaxInterval, rc.RandomizationFactor = 40*time.Millisecond, 40*time.Millisecond, -1
	})
	var calls atomic.Int32
	_, err = stage.Middleware(r.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) < 3 {
			return nil, errors.New("timeout")
		}
		return nil, nil
	}))(msg("m1", "x"))
	if err != nil || calls.Load() != 3 {
		t.Fatalf("err %v calls %d", err, calls.Load())
	}
	if counting.extends.Load() == 0 {
		t.Fatal("no heartbeat extended the lease during 80ms of retry waits with a 5ms heartbeat")
	}
}

func TestNewRetryRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg     pipeline.RetryConfig
		setting string
	}{
		"initial": {pipeline.RetryConfig{InitialInterval: -1}, "RetryConfig.InitialInterval"},
		"mult":    {pipeline.RetryConfig{Multiplier: 0.5}, "RetryConfig.Multiplier"},
		"max":     {pipeline.RetryConfig{InitialInterval: time.Second, MaxInterval: time.Millisecond}, "RetryConfig.MaxInterval"},
		"jitter":  {pipeline.RetryConfig{RandomizationFactor: 1}, "RetryConfig.RandomizationFactor"},
		"elapsed": {pipeline.RetryConfig{MaxElapsedTime: -1}, "RetryConfig.MaxElapsedTime"},
		"tries":   {pipeline.RetryConfig{MaxTries: -1}, "RetryConfig.MaxTries"},
	} {
		var ce *oncemill.ConfigError
		if _, err := pipeline.NewRetry(tc.cfg); !errors.As(err, &ce) || ce.Setting != tc.setting {
			t.Errorf("%s: got %v, want a ConfigError for %s", name, err, tc.setting)
		}
	}
	if _, err := pipeline.NewRetry(pipeline.RetryConfig{}); err != nil {
		t.Errorf("the zero RetryConfig is the defaults, got %v", err)
	}
}

func TestBreakerCountsOnlyRetryableFailures(t *testing.T) {
	t.Parallel()
	var changes []string
	bc := pipeline.BreakerConfig{}
	bc.Name = "gateway"
	bc.ReadyToTrip = func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 2 }
	bc.OnStateChange = func(name string, from, to gobreaker.State) {
		changes = append(changes, name+":"+from.String()+"->"+to.String())
	}
	b, err := pipeline.NewBreaker(bc)
	if err != nil {
		t.Fatal(err)
	}
	declined := policy.Cached(errors.New("declined"))
	h := b.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if m.UUID == "business" {
			return nil, declined
		}
		return nil, errors.New("connection refused")
	})
	for i := 0; i < 5; i++ {
		if _, err := h(msg("business", "")); !errors.Is(err, declined) {
			t.Fatal(err)
		}
	}
	if b.State() != gobreaker.StateClosed {
		t.Fatal("business failures opened the circuit")
	}
	_, _ = h(msg("infra", ""))
	_, _ = h(msg("infra", ""))
	if b.State() != gobreaker.StateOpen || len(changes) != 1 || changes[0] != "gateway:closed->open" {
		t.Fatalf("state %v, changes %v", b.State(), changes)
	}
	if _, err := h(msg("infra", "")); !errors.Is(err, pipeline.ErrCircuitOpen) || !errors.Is(err, gobreaker.ErrOpenState) {
		t.Fatalf("open circuit returned %v", err)
	}
}

func TestNewBreakerRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		cfg     pipeline.BreakerConfig
		setting string
	}{
		"timeout":  {pipeline.BreakerConfig{Timeout: -1}, "BreakerConfig.Timeout"},
		"interval": {pipeline.BreakerConfig{Interval: -1}, "BreakerConfig.Interval"},
	} {
		var ce *oncemill.ConfigError
		if _, err := pipeline.NewBreaker(tc.cfg); !errors.As(err, &ce) || ce.Setting != tc.setting {
			t.Errorf("%s: got %v, want a ConfigError for %s", name, err, tc.setting)
		}
	}
	if _, err := pipeline.NewBreaker(pipeline.BreakerConfig{}); err != nil {
		t.Errorf("the zero BreakerConfig is the defaults, got %v", err)
	}
}

// The transaction stage alone: commit after success, rollback on error and
// on panic (which goes on to the caller).
func TestTransactionStandalone(t *testing.T) {
	t.Parallel()
	tm := &fakeTxManager{}
	tx, err := pipeline.NewTransaction(tm)
	if err != nil {
		t.Fatal(err)
	}
	var sawTx bool
	if _, err := tx.Middleware(func(m *message.Message) ([]*message.Message, error) {
		_, sawTx = m.Context().Value(fakeTxKey{}).(*fakeTx)
		return nil, nil
	})(msg("m1", "")); err != nil || !sawTx || tm.commits.Load() != 1 {
		t.Fatalf("success: err %v, handler saw its tx %v, commits %d", err, sawTx, tm.commits.Load())
	}
	if _, err := tx.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, errors.New("x") })(msg("m2", "")); err == nil || tm.rollbacks.Load() != 1 {
		t.Fatalf("error: %v rollbacks %d", err, tm.rollbacks.Load())
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("the panic must go on to the caller")
			}
		}()
		_, _ = tx.Middleware(func(*message.Message) ([]*message.Message, error) { panic("boom") })(msg("m3", ""))
	}()
	if tm.rollbacks.Load() != 2 || tm.commits.Load() != 1 {
		t.Fatalf("after panic: rollbacks %d commits %d", tm.rollbacks.Load(), tm.commits.Load())
	}
	if _, err := pipeline.NewTransaction(nil); !errors.Is(err, oncemill.ErrInvalidConfig) {
		t.Fatalf("nil manager: %v", err)
	}
}

// failingPublisher fails its first n publishes.
type failingPublisher struct {
	message.Publisher
	fail atomic.Int32
}

func (p *failingPublisher) Publish(topic string, msgs ...*message.Message) error {
	if p.fail.Add(-1) >= 0 {
		return errors.New("broker unavailable")
	}
	return p.Publisher.Publish(topic, msgs...)
}

// A cached failure is dead-lettered once; if forwarding fails, the delivery
// is nacked and the key released, so nothing is lost.
func TestDeadLetterOnceAndNeverLost(t *testing.T) {
	t.Parallel()
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
	defer pubSub.Close()
	dead, err := pubSub.Subscribe(context.Background(), "dead")
	if err != nil {
		t.Fatal(err)
	}
	pub := &failingPublisher{Publisher: pubSub}
	pub.fail.Store(1)
	dl, err := pipeline.NewDeadLetter(pub, "dead")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *pipeline.IdempotencyConfig) { c.DeadLetter = dl })
	var calls atomic.Int32
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls.Add(1)
		return nil, policy.Cached(errDeclined)
	})
	if _, err := handler(msg("m1", "x")); err == nil {
		t.Fatal("a failed forward must nack")
	}
	if rec, err := h.store.Get(context.Background(), "test", "m1"); err != nil || rec.Status != store.StatusRetryable {
		t.Fatalf("after a failed forward: %v %v, want the key released", rec.Status, err)
	}
	for i := 0; i < 3; i++ { // the redelivery, then duplicates
		if _, err := handler(msg("m1", "x")); err != nil {
			t.Fatal(err)
		}
	}
	got := <-dead
	got.Ack()
	if got.UUID != "m1" || pipeline.DeadLetterReason(got.Metadata.Get(pipeline.ReasonKindKey)) != pipeline.DeadLetterReasonCachedFailure {
		t.Fatalf("dead letter %s %v", got.UUID, got.Metadata)
	}
	select {
	case extra := <-dead:
		t.Fatalf("dead-lettered twice: %s", extra.UUID)
	case <-time.After(50 * time.Millisecond):
	}
	if calls.Load() != 2 {
		t.Fatalf("handler ran %d times, want 2 (first try, redelivery)", calls.Load())
	}
	if _, err := pipeline.NewDeadLetter(nil, "t"); !errors.Is(err, oncemill.ErrInvalidConfig) {
		t.Fatal(err)
	}
	if _, err := pipeline.NewDeadLetter(pubSub, ""); !errors.Is(err, oncemill.ErrInvalidConfig) || !strings.Contains(err.Error(), "topic") {
		t.Fatal(err)
	}
}

func TestMismatchIsDeadLettered(t *testing.T) {
	t.Parallel()
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
	defer pubSub.Close()
	dead, _ := pubSub.Subscribe(context.Background(), "dead")
	dl, _ := pipeline.NewDeadLetter(pubSub, "dead")
	h := newHarness(t, func(c *pipeline.IdempotencyConfig) { c.DeadLetter = dl })
	var calls atomic.Int32
	handler := h.stage.Middleware(produce(&calls))
	_, _ = handler(msg("m1", `{"amount":1}`))
	if _, err := handler(msg("m1", `{"amount":2}`)); err != nil {
		t.Fatal(err)
	}
	got := <-dead
	got.Ack()
	if string(got.Payload) != `{"amount":2}` || pipeline.DeadLetterReason(got.Metadata.Get(pipeline.ReasonKindKey)) != pipeline.DeadLetterReasonMismatch {
		t.Fatalf("dead letter %q %v", got.Payload, got.Metadata)
	}
}

func TestNewValidationRefusesNil(t *testing.T) {
	t.Parallel()
	if _, err := pipeline.NewValidation(pipeline.ValidationConfig{}); !errors.Is(err, oncemill.ErrInvalidConfig) {
		t.Fatal(err)
	}
}
