package receiver_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

func TestBuildRefusesBadConfiguration(t *testing.T) {
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cases := []struct {
		name  string
		build func() *receiver.Builder
		says  string // what the error must tell the user to change
	}{
		{"nil store", func() *receiver.Builder { return receiver.New(nil) }, "Store is nil"},
		{"nil key generator", func() *receiver.Builder { return receiver.New(st).WithKeyGenerator(nil) }, "WithKeyGenerator(nil)"},
		{"nil fingerprint", func() *receiver.Builder { return receiver.New(st).WithFingerprint(nil) }, "WithoutFingerprint"},
		{"empty scope", func() *receiver.Builder { return receiver.New(st).WithScope("") }, "WithScope"},
		{"zero success TTL", func() *receiver.Builder { return receiver.New(st).WithSuccessTTL(0) }, "SuccessTTL"},
		{"negative failure TTL", func() *receiver.Builder { return receiver.New(st).WithFailureTTL(-time.Second) }, "FailureTTL"},
		{"zero lease", func() *receiver.Builder { return receiver.New(st).WithLease(0) }, "Lease is 0s"},
		{"heartbeat equal to lease", func() *receiver.Builder {
			return receiver.New(st).WithLease(time.Second).WithHeartbeat(time.Second)
		}, "not shorter than Lease"},
		{"heartbeat longer than lease", func() *receiver.Builder {
			return receiver.New(st).WithHeartbeat(time.Minute)
		}, "not shorter than Lease"},
		{"zero heartbeat", func() *receiver.Builder { return receiver.New(st).WithHeartbeat(0) }, "Heartbeat is 0s"},
		{"zero attempts", func() *receiver.Builder { return receiver.New(st).WithMaxAttempts(0) }, "MaxAttempts"},
		{"unknown in-progress mode", func() *receiver.Builder {
			return receiver.New(st).WithInProgress(policy.HeldKeyMode(9), time.Second)
		}, "policy.Wait"},
		{"wait without bound", func() *receiver.Builder { return receiver.New(st).WithInProgress(policy.HeldKeyWait, 0) }, "InProgressWait"},
		{"negative nack delay", func() *receiver.Builder { return receiver.New(st).WithNackDelay(-1) }, "NackDelay"},
		{"unknown missing-key mode", func() *receiver.Builder {
			return receiver.New(st).WithMissingKey(policy.MissingKeyMode(7))
		}, "policy.FailMissingKey"},
		{"zero result size", func() *receiver.Builder { return receiver.New(st).WithMaxResultBytes(0) }, "MaxResultBytes"},
		{"zero payload size", func() *receiver.Builder { return receiver.New(st).WithMaxPayloadBytes(0) }, "MaxPayloadBytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.build().Build()
			if r != nil || !errors.Is(err, receiver.ErrInvalidConfig) {
				t.Fatalf("Build() = %v, %v; want ErrInvalidConfig", r, err)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %q does not say %q", err, tc.says)
			}
		})
	}
}

func TestBuildReportsEveryBuilderMistake(t *testing.T) {
	_, err := receiver.New(nil).WithKeyGenerator(nil).WithScope("").Build()
	for _, want := range []string{"WithKeyGenerator(nil)", "WithScope"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v does not mention %s", err, want)
		}
	}
}

func TestHeartbeatFollowsTheLeaseUnlessSet(t *testing.T) {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	// A 3s lease with the default 10s heartbeat would be refused; the
	// heartbeat follows the lease when it was not set explicitly.
	if _, err := receiver.New(st).WithLease(3 * time.Second).Build(); err != nil {
		t.Fatalf("lease without explicit heartbeat: %v", err)
	}
	if _, err := receiver.New(st).WithHeartbeat(2 * time.Second).WithLease(3 * time.Second).Build(); err != nil {
		t.Fatalf("explicit heartbeat below the lease: %v", err)
	}
}

func TestWrapRunsOncePerKey(t *testing.T) {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	var outcomes []pipeline.Outcome
	r, err := receiver.New(st).WithScope("orders").WithEventHandler(func(e pipeline.Event) {
		outcomes = append(outcomes, e.Outcome)
	}).Build()
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	h := r.Wrap(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })
	for i := 0; i < 3; i++ {
		if _, err := h(message.NewMessage("order-1", []byte("{}"))); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 || len(outcomes) != 3 || outcomes[0] != pipeline.OutcomeExecuted || outcomes[2] != pipeline.OutcomeReplayed {
		t.Fatalf("calls %d outcomes %v", calls, outcomes)
	}
}

func TestBuildRefusesBadStageConfiguration(t *testing.T) {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	cases := []struct {
		name  string
		build func() *receiver.Builder
		says  string
	}{
		{"nil validation", func() *receiver.Builder { return receiver.New(st).WithValidation(nil) }, "WithValidation(nil)"},
		{"zero retry config", func() *receiver.Builder { return receiver.New(st).WithRetry(pipeline.RetryConfig{}) }, "pipeline.DefaultRetryConfig()"},
		{"zero breaker config", func() *receiver.Builder { return receiver.New(st).WithCircuitBreaker(pipeline.BreakerConfig{}) }, "pipeline.DefaultBreakerConfig()"},
		{"nil transaction manager", func() *receiver.Builder { return receiver.New(st).WithSeparateTransaction(nil) }, "WithSeparateTransaction(nil)"},
		{"nil transactional store", func() *receiver.Builder { return receiver.NewTransactional(nil) }, "Store is nil"},
		{"a second transaction in the one-transaction mode", func() *receiver.Builder {
			return receiver.NewTransactional(struct{ store.Transactional }{}).WithSeparateTransaction(telTxManager{})
		}, "drop WithSeparateTransaction"},
		{"nil dead-letter publisher", func() *receiver.Builder { return receiver.New(st).WithDeadLetter(nil, "dead") }, "publisher is nil"},
		{"empty dead-letter topic", func() *receiver.Builder {
			return receiver.New(st).WithDeadLetter(gochannel.NewGoChannel(gochannel.Config{}, nil), "")
		}, "topic is empty"},
		{"nil slog logger", func() *receiver.Builder { return receiver.New(st).WithSlog(nil) }, "WithSlog(nil)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.build().Build()
			if r != nil || !errors.Is(err, receiver.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("Build() = %v, %v; want ErrInvalidConfig saying %q", r, err, tc.says)
			}
		})
	}
}

// The builder assembles every stage, and the defaults need no configuration.
func TestBuildFullChainWithDefaults(t *testing.T) {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	var outcomes []pipeline.Outcome
	r, err := receiver.New(st).WithScope("s").
		WithValidation(func(m *message.Message) error {
			if len(m.Payload) == 0 {
				return errors.New("empty")
			}
			return nil
		}).
		WithRetry(pipeline.DefaultRetryConfig()).
		WithCircuitBreaker(pipeline.DefaultBreakerConfig()).
		WithEventHandler(func(e pipeline.Event) { outcomes = append(outcomes, e.Outcome) }).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	h := r.Wrap(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })
	for _, m := range []*message.Message{
		message.NewMessage("a", []byte("x")), message.NewMessage("a", []byte("x")), message.NewMessage("b", nil),
	} {
		if _, err := h(m); err != nil {
			t.Fatal(err)
		}
	}
	want := []pipeline.Outcome{pipeline.OutcomeExecuted, pipeline.OutcomeReplayed, pipeline.OutcomeInvalid}
	if calls != 1 || len(outcomes) != 3 || outcomes[0] != want[0] || outcomes[1] != want[1] || outcomes[2] != want[2] {
		t.Fatalf("calls %d outcomes %v, want 1 and %v", calls, outcomes, want)
	}
}

// A scope that some store cannot hold is refused at Build, not discovered
// by every message after it.
func TestBuildRefusesAScopeNoStoreHolds(t *testing.T) {
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	for name, scope := range map[string]string{
		"a NUL byte":    "s\x00x",
		"invalid UTF-8": "s\xff",
		"2,000 bytes":   strings.Repeat("s", 2000),
	} {
		r, err := receiver.New(st).WithScope(scope).Build()
		if r != nil || !errors.Is(err, receiver.ErrInvalidConfig) || !strings.Contains(err.Error(), "store.MaxScopeLen") {
			t.Errorf("%s: Build = %v, %v; want ErrInvalidConfig saying what a scope may be", name, r, err)
		}
	}
}
