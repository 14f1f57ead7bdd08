package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
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

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// retryHarness is the harness's stage with in-process retries of a few
// milliseconds, changed by mutate.
func retryHarness(t *testing.T, mutate func(*pipeline.RetryConfig)) *harness {
	t.Helper()
	rc := &pipeline.RetryConfig{InitialInterval: time.Millisecond, MaxInterval: 2 * time.Millisecond}
	if mutate != nil {
		mutate(rc)
	}
	return newHarness(t, func(c *stageConfig) { c.Retry = rc })
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
			h := retryHarness(t, nil)
			var calls atomic.Int32
			_, _ = h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
				calls.Add(1)
				return nil, tc.err
			})(msg("m1", "x"))
			if e := h.last(); !errors.Is(e.Err, tc.err) || calls.Load() != tc.wantCalls {
				t.Fatalf("got %v after %d calls, want the error after %d", e.Err, calls.Load(), tc.wantCalls)
			}
		})
	}
}

func TestRetrySucceedsAfterTransientFailures(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	var waits []time.Duration
	h := retryHarness(t, func(rc *pipeline.RetryConfig) {
		rc.MaxTries = 5
		rc.OnRetry = func(try int, err error, wait time.Duration) { waits = append(waits, wait) }
	})
	out, err := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) < 3 {
			return nil, errors.New("timeout")
		}
		return []*message.Message{msg("out", "")}, nil
	})(msg("m1", "x"))
	if err != nil || len(out) != 1 || calls.Load() != 3 || len(waits) != 2 {
		t.Fatalf("out %v err %v calls %d waits %v", out, err, calls.Load(), waits)
	}
	if e := h.last(); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 1 {
		t.Fatalf("event %+v, want executed in the delivery's one attempt", e)
	}
}

func TestRetryStopsWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	h := retryHarness(t, func(rc *pipeline.RetryConfig) {
		rc.InitialInterval, rc.MaxInterval, rc.MaxElapsedTime, rc.MaxTries = time.Hour, time.Hour, 2*time.Hour, 10
	})
	ctx, cancel := context.WithCancel(context.Background())
	m := msg("m1", "x")
	m.SetContext(ctx)
	timeout := errors.New("timeout")
	done := make(chan error, 1)
	go func() {
		_, err := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, timeout })(m)
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
	h := retryHarness(t, func(rc *pipeline.RetryConfig) {
		rc.InitialInterval, rc.MaxInterval, rc.MaxElapsedTime, rc.MaxTries = time.Minute, time.Minute, time.Second, 10
	})
	start := time.Now()
	_, err := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, errors.New("x") })(msg("m1", "x"))
	if err == nil || calls.Load() != 1 || time.Since(start) > 30*time.Second {
		t.Fatalf("a first wait past MaxElapsedTime must give up at once: %v after %d calls", err, calls.Load())
	}
}

// The heartbeat runs while retry waits.
func TestRetryKeepsTheLeaseAliveWhileItWaits(t *testing.T) {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	counting := &countingStore{Store: st}
	p := policy.Policy{}.WithDefaults()
	p.LeaseDuration, p.Heartbeat = time.Minute, 5*time.Millisecond
	stage, err := idempotency.NewLeased(counting, idempotency.Config{
		KeyGenerator: keygen.UUID(), Scope: "s", Policy: p,
		Retry: &pipeline.RetryConfig{InitialInterval: 40 * time.Millisecond, MaxInterval: 40 * time.Millisecond, RandomizationFactor: -1},
	})
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	_, err = stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) < 3 {
			return nil, errors.New("timeout")
		}
		return nil, nil
	})(msg("m1", "x"))
	if err != nil || calls.Load() != 3 {
		t.Fatalf("err %v calls %d", err, calls.Load())
	}
	if counting.extends.Load() == 0 {
		t.Fatal("no heartbeat extended the lease during 80ms of retry waits with a 5ms heartbeat")
	}
}

func TestRetryConfigRefusesBadValues(t *testing.T) {
	t.Parallel()
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	for name, tc := range map[string]struct {
		cfg     pipeline.RetryConfig
		setting string
	}{
		"initial": {pipeline.RetryConfig{InitialInterval: -1}, "WithRetry(RetryConfig.InitialInterval)"},
		"mult":    {pipeline.RetryConfig{Multiplier: 0.5}, "WithRetry(RetryConfig.Multiplier)"},
		"max":     {pipeline.RetryConfig{InitialInterval: time.Second, MaxInterval: time.Millisecond}, "WithRetry(RetryConfig.MaxInterval)"},
		"jitter":  {pipeline.RetryConfig{RandomizationFactor: 1}, "WithRetry(RetryConfig.RandomizationFactor)"},
		"elapsed": {pipeline.RetryConfig{MaxElapsedTime: -1}, "WithRetry(RetryConfig.MaxElapsedTime)"},
		"tries":   {pipeline.RetryConfig{MaxTries: -1}, "WithRetry(RetryConfig.MaxTries)"},
	} {
		var ce *oncemill.ConfigError
		if _, err := idempotency.NewLeased(st, idempotency.Config{Retry: &tc.cfg}); !errors.As(err, &ce) || ce.Setting != tc.setting {
			t.Errorf("%s: got %v, want a ConfigError for %s", name, err, tc.setting)
		}
		if _, err := idempotency.NewTransactional(newFakeTxStore(), idempotency.Config{Retry: &tc.cfg}); !errors.As(err, &ce) || ce.Setting != tc.setting {
			t.Errorf("%s, one-transaction mode: got %v, want a ConfigError for %s", name, err, tc.setting)
		}
	}
	if _, err := idempotency.NewLeased(st, idempotency.Config{Retry: &pipeline.RetryConfig{}}); err != nil {
		t.Errorf("the zero RetryConfig is the defaults, got %v", err)
	}
}

func TestBreakerCountsOnlyRetryableFailures(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var changes []string
	h := newHarness(t, func(c *stageConfig) {
		c.CircuitBreaker = &gobreaker.Settings{
			Name:        "gateway",
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 2 },
			OnStateChange: func(name string, from, to gobreaker.State) {
				mu.Lock()
				changes = append(changes, name+":"+from.String()+"->"+to.String())
				mu.Unlock()
			},
		}
	})
	declined := policy.Cached(errors.New("declined"))
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if string(m.Payload) == "business" {
			return nil, declined
		}
		return nil, errors.New("connection refused")
	})
	for i := 0; i < 5; i++ {
		if _, err := handler(msg(fmt.Sprint("b", i), "business")); err != nil {
			t.Fatal(err)
		}
		if e := h.last(); !errors.Is(e.Err, declined) || e.Outcome != pipeline.OutcomeCachedFailure {
			t.Fatalf("business failure %d: %+v", i, e)
		}
	}
	changed := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(changes)
	}
	if got := changed(); len(got) != 0 {
		t.Fatalf("business failures changed the circuit: %v", got)
	}
	_, _ = handler(msg("i1", "infra"))
	_, _ = handler(msg("i2", "infra"))
	if got := changed(); len(got) != 1 || got[0] != "gateway:closed->open" {
		t.Fatalf("changes %v, want the circuit opened once", got)
	}
	var calls atomic.Int32
	open := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) { calls.Add(1); return nil, nil })
	if _, err := open(msg("i3", "infra")); !errors.Is(err, pipeline.ErrCircuitOpen) || !errors.Is(err, gobreaker.ErrOpenState) || calls.Load() != 0 {
		t.Fatalf("open circuit returned %v after %d handler calls", err, calls.Load())
	}
}

// The zero gobreaker.Settings are gobreaker's defaults: the circuit opens
// after more than five consecutive retryable failures, named "oncemill".
func TestBreakerZeroSettingsAreGobreakersDefaults(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) { c.CircuitBreaker = &gobreaker.Settings{} })
	var calls atomic.Int32
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		calls.Add(1)
		return nil, errors.New("connection refused")
	})
	for i := range 6 {
		if _, err := handler(msg(fmt.Sprint("m", i), "x")); err == nil || errors.Is(err, pipeline.ErrCircuitOpen) {
			t.Fatalf("failure %d: %v, want the handler's own error with the circuit still closed", i+1, err)
		}
	}
	_, err := handler(msg("m6", "x"))
	if !errors.Is(err, pipeline.ErrCircuitOpen) || !strings.Contains(err.Error(), "oncemill") || calls.Load() != 6 {
		t.Fatalf("after six failures: %v after %d calls, want ErrCircuitOpen of the breaker named oncemill, without a call", err, calls.Load())
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
	h := newHarness(t, func(c *stageConfig) { c.DeadLetterPublisher, c.DeadLetterTopic = pub, "dead" })
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
	// The publisher and the topic come together.
	for _, cfg := range []idempotency.Config{{DeadLetterTopic: "t"}, {DeadLetterPublisher: pubSub}} {
		var ce *oncemill.ConfigError
		if _, err := idempotency.NewLeased(h.store, cfg); !errors.As(err, &ce) || ce.Setting != "WithDeadLetter" || !strings.Contains(err.Error(), "topic") {
			t.Fatalf("dead letter publisher %v, topic %q: %v, want a ConfigError for WithDeadLetter", cfg.DeadLetterPublisher, cfg.DeadLetterTopic, err)
		}
	}
}

func TestMismatchIsDeadLettered(t *testing.T) {
	t.Parallel()
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
	defer pubSub.Close()
	dead, _ := pubSub.Subscribe(context.Background(), "dead")
	h := newHarness(t, func(c *stageConfig) { c.DeadLetterPublisher, c.DeadLetterTopic = pubSub, "dead" })
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

// Every dead letter says why: the reason kind, the attempt that failed (0
// when the handler never ran for the delivery) and the last error, one
// case per pipeline.DeadLetterReason; oncemill.dead_letters counts it
// under the same reason. The last delivery of each case is dead-lettered.
func TestDeadLetterSaysWhy(t *testing.T) {
	t.Parallel()
	declined := func(*message.Message) ([]*message.Message, error) { return nil, policy.Cached(errDeclined) }
	var timeouts atomic.Int32
	timeout := func(*message.Message) ([]*message.Message, error) {
		return nil, fmt.Errorf("timeout on attempt %d", timeouts.Add(1))
	}
	m1 := func() *message.Message { return msg("m1", "x") }
	refusingKeys, err := memory.New(memory.Options{MaxKeyLen: 8}) // a key hashed to fit no store of 8 bytes
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = refusingKeys.Close() })
	cases := map[string]struct {
		reason  pipeline.DeadLetterReason
		config  func(*stageConfig)
		handler message.HandlerFunc // nil: succeeds
		held    bool                // the key is held by another delivery
		msgs    []*message.Message
		attempt int
		lastErr string
	}{
		"invalid": {
			reason: pipeline.DeadLetterReasonInvalid,
			config: func(c *stageConfig) {
				c.Validation = func(*message.Message) error { return errors.New("amount is missing") }
			},
			msgs:    []*message.Message{m1()},
			lastErr: "oncemill: invalid message: amount is missing",
		},
		"cached failure": {
			reason: pipeline.DeadLetterReasonCachedFailure, handler: declined,
			msgs: []*message.Message{m1()}, attempt: 1, lastErr: "card declined",
		},
		"attempts exhausted": {
			reason:  pipeline.DeadLetterReasonAttemptsExhausted,
			config:  func(c *stageConfig) { c.Policy.MaxAttempts = 3 },
			handler: timeout,
			msgs:    []*message.Message{m1(), m1(), m1()},
			attempt: 3, lastErr: "timeout on attempt 3",
		},
		"mismatch": {
			reason: pipeline.DeadLetterReasonMismatch,
			msgs:   []*message.Message{m1(), msg("m1", "y")}, lastErr: "another payload fingerprint",
		},
		"duplicate of a finished key": {
			reason: pipeline.DeadLetterReasonDuplicateRejected,
			config: func(c *stageConfig) { c.Policy.FinishedKey = policy.FinishedKeyReject },
			msgs:   []*message.Message{m1(), m1()}, lastErr: `oncemill: duplicate rejected: scope "test" key "m1": succeeded, attempt 1`,
		},
		"duplicate of a held key": {
			reason: pipeline.DeadLetterReasonDuplicateRejected,
			config: func(c *stageConfig) { c.Policy.HeldKey = policy.HeldKeyReject },
			held:   true, msgs: []*message.Message{m1()}, lastErr: `oncemill: duplicate rejected: scope "test" key "m1": in_progress`,
		},
		"no key": {
			reason: pipeline.DeadLetterReasonNoKey,
			config: func(c *stageConfig) { c.KeyGenerator, _ = keygen.Metadata("order_id") },
			msgs:   []*message.Message{m1()}, lastErr: "oncemill: no key",
		},
		"payload too large": {
			reason: pipeline.DeadLetterReasonPayloadTooLarge,
			config: func(c *stageConfig) { c.Policy.MaxPayloadBytes = 4 },
			msgs:   []*message.Message{msg("m1", "12345")}, lastErr: "5 bytes, limit 4",
		},
		"key the store refuses": {
			reason: pipeline.DeadLetterReasonKeyRefused,
			config: func(c *stageConfig) { c.Store = refusingKeys },
			msgs:   []*message.Message{msg("longer-than-8", "x")}, lastErr: "longer than MaxKeyLen 8",
		},
		"key generator failed": {
			reason: pipeline.DeadLetterReasonKeyFailed,
			config: func(c *stageConfig) {
				c.KeyGenerator = keygen.Func(func(*message.Message) (string, error) {
					return "", policy.Cached(errors.New("the key service refuses the message"))
				})
			},
			msgs: []*message.Message{m1()}, lastErr: "cannot compute the idempotency key: the key service refuses the message",
		},
	}
	tested := map[string]bool{}
	for _, tc := range cases {
		tested[string(tc.reason)] = true
	}
	if declared := declaredReasons(t); !maps.Equal(tested, declared) {
		t.Fatalf("reasons tested %v, declared in package pipeline %v: one case per reason", slices.Sorted(maps.Keys(tested)), slices.Sorted(maps.Keys(declared)))
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
			t.Cleanup(func() { _ = pubSub.Close() })
			dead, err := pubSub.Subscribe(context.Background(), "dead")
			if err != nil {
				t.Fatal(err)
			}
			k := newTelKit(t)
			h := newHarness(t, func(c *stageConfig) {
				k.use(&c.Config)
				c.DeadLetterPublisher, c.DeadLetterTopic = pubSub, "dead"
				if tc.config != nil {
					tc.config(c)
				}
			})
			if tc.held {
				m := tc.msgs[0]
				if _, err := h.store.ClaimLease(context.Background(), store.LeaseRequest{Scope: "test", Key: m.UUID, Fingerprint: keygen.PayloadFingerprint(m), LeaseDuration: time.Minute}); err != nil {
					t.Fatal(err)
				}
			}
			run := tc.handler
			if run == nil {
				run = func(*message.Message) ([]*message.Message, error) { return nil, nil }
			}
			handler := h.stage.Middleware(run)
			for i, m := range tc.msgs {
				_, err := handler(m)
				if last := i == len(tc.msgs)-1; last && err != nil {
					t.Fatalf("the dead-lettered delivery = %v, want an ack", err)
				}
				h.clock.Advance(time.Minute) // past any pause before the next attempt
			}
			var got *message.Message
			select {
			case got = <-dead:
				got.Ack()
			case <-time.After(10 * time.Second):
				t.Fatal("no dead letter")
			}
			if got.UUID != tc.msgs[len(tc.msgs)-1].UUID {
				t.Errorf("dead letter of %s, want %s", got.UUID, tc.msgs[len(tc.msgs)-1].UUID)
			}
			if kind := got.Metadata.Get(pipeline.ReasonKindKey); kind != string(tc.reason) {
				t.Errorf("%s = %q, want %q", pipeline.ReasonKindKey, kind, tc.reason)
			}
			if attempt := got.Metadata.Get(pipeline.AttemptKey); attempt != strconv.Itoa(tc.attempt) {
				t.Errorf("%s = %q, want %d", pipeline.AttemptKey, attempt, tc.attempt)
			}
			if why := got.Metadata.Get(middleware.ReasonForPoisonedKey); !strings.Contains(why, tc.lastErr) {
				t.Errorf("%s = %q, want it to contain %q", middleware.ReasonForPoisonedKey, why, tc.lastErr)
			}
			if counted := teltest.Sums(t, k.collect(t), "oncemill.dead_letters", "reason"); !maps.Equal(counted, map[string]int64{string(tc.reason): 1}) {
				t.Errorf("oncemill.dead_letters by reason %v, want %s: 1", counted, tc.reason)
			}
		})
	}
}

// declaredReasons are the strings of the DeadLetterReason constants.
func declaredReasons(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, reason := range testenv.DeadLetterReasons(t) {
		out[reason] = true
	}
	return out
}
