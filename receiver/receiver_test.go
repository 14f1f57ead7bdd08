package receiver_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/sony/gobreaker/v2"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

func TestBuildRefusesBadConfiguration(t *testing.T) {
	t.Parallel()
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
		{"nil key generator", func() *receiver.Builder { return receiver.New(st).WithKeyGenerator(nil) }, "WithKeyGenerator: nil"},
		{"nil fingerprint", func() *receiver.Builder { return receiver.New(st).WithFingerprint(nil) }, "keygen.NoFingerprint"},
		{"empty scope", func() *receiver.Builder { return receiver.New(st).WithScope("") }, "WithScope"},
		{"negative success TTL", func() *receiver.Builder { return withPolicy(st, policy.Policy{SuccessTTL: -1}) }, "WithPolicy(Policy.SuccessTTL)"},
		{"heartbeat equal to lease", func() *receiver.Builder {
			return withPolicy(st, policy.Policy{LeaseDuration: time.Second, Heartbeat: time.Second})
		}, "not shorter than Lease"},
		{"heartbeat longer than the default lease", func() *receiver.Builder {
			return withPolicy(st, policy.Policy{Heartbeat: time.Minute})
		}, "not shorter than Lease"},
		{"unknown held-key mode", func() *receiver.Builder { return withPolicy(st, policy.Policy{HeldKey: 9}) }, "policy.HeldKeyWait"},
		{"unknown missing-key mode", func() *receiver.Builder { return withPolicy(st, policy.Policy{MissingKey: 7}) }, "policy.MissingKeyReject"},
		{"negative payload size", func() *receiver.Builder { return withPolicy(st, policy.Policy{MaxPayloadBytes: -1}) }, "WithPolicy(Policy.MaxPayloadBytes)"},
		{"kafka keeping exhausted messages without a dead letter", func() *receiver.Builder {
			return receiver.New(st).WithMessagingSystem(semconv.MessagingSystemKafka)
		}, "hold up the messages behind it"},
		{"a heartbeat in the one-transaction mode", func() *receiver.Builder {
			return receiver.NewTransactional(struct{ store.Transactional }{}).WithPolicy(policy.Policy{Heartbeat: time.Second})
		}, "WithPolicy(Policy.Heartbeat): has no effect"},
		{"rabbitmq keeping exhausted messages without a dead letter", func() *receiver.Builder {
			return receiver.New(st).WithMessagingSystem(semconv.MessagingSystemRabbitMQ)
		}, "ExhaustedKeep on rabbitmq"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.build().Build()
			if r != nil || !errors.Is(err, oncemill.ErrInvalidConfig) {
				t.Fatalf("Build() = %v, %v; want ErrInvalidConfig", r, err)
			}
			if !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("error %q does not say %q", err, tc.says)
			}
		})
	}
}

func withPolicy(st *memory.Store, p policy.Policy) *receiver.Builder {
	return receiver.New(st).WithPolicy(p)
}

func TestBuildReportsEveryBuilderMistake(t *testing.T) {
	t.Parallel()
	_, err := receiver.New(nil).WithKeyGenerator(nil).WithScope("").Build()
	for _, want := range []string{"WithKeyGenerator", "WithScope"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("error %v does not mention %s", err, want)
		}
	}
}

func TestHeartbeatFollowsTheLeaseUnlessSet(t *testing.T) {
	t.Parallel()
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	// A 3s lease with a 10s heartbeat would be refused; a zero heartbeat
	// follows the lease.
	if _, err := withPolicy(st, policy.Policy{LeaseDuration: 3 * time.Second}).Build(); err != nil {
		t.Fatalf("lease without explicit heartbeat: %v", err)
	}
	if _, err := withPolicy(st, policy.Policy{LeaseDuration: 3 * time.Second, Heartbeat: 2 * time.Second}).Build(); err != nil {
		t.Fatalf("explicit heartbeat below the lease: %v", err)
	}
}

func TestMiddlewareRunsOncePerKey(t *testing.T) {
	t.Parallel()
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
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })
	for i := 0; i < 3; i++ {
		if _, err := h(message.NewMessage("order-1", []byte("{}"))); err != nil {
			t.Fatal(err)
		}
	}
	if calls != 1 || len(outcomes) != 3 || outcomes[0] != pipeline.OutcomeExecuted || outcomes[2] != pipeline.OutcomeReplayed {
		t.Fatalf("calls %d outcomes %v", calls, outcomes)
	}
}

// Every refused setting is reported as the user wrote it: the builder
// method they called (and the field of its argument), never a pipeline type
// they did not see.
func TestBuildNamesTheBuilderMethod(t *testing.T) {
	t.Parallel()
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	ts := struct{ store.Transactional }{}
	cases := []struct {
		name    string
		build   func() *receiver.Builder
		setting string
		says    string
	}{
		{"nil transactional store", func() *receiver.Builder { return receiver.NewTransactional(nil) }, "NewTransactional", "nil"},
		{"nil store", func() *receiver.Builder { return receiver.New(nil) }, "New", "nil"},
		{"nil validation", func() *receiver.Builder { return receiver.New(st).WithValidation(nil) }, "WithValidation", "nil"},
		{"bad retry config", func() *receiver.Builder {
			return receiver.New(st).WithRetry(pipeline.RetryConfig{Multiplier: 0.5})
		}, "WithRetry(RetryConfig.Multiplier)", "below 1"},
		{"negative breaker timeout", func() *receiver.Builder {
			return receiver.New(st).WithCircuitBreaker(gobreaker.Settings{Timeout: -time.Second})
		}, "WithCircuitBreaker(gobreaker.Settings.Timeout)", "negative"},
		{"heartbeat not shorter than the lease", func() *receiver.Builder {
			return receiver.New(st).WithPolicy(policy.Policy{LeaseDuration: time.Second, Heartbeat: 2 * time.Second})
		}, "WithPolicy(Policy.Heartbeat)", "not shorter"},
		{"a lease in the one-transaction mode", func() *receiver.Builder {
			return receiver.NewTransactional(ts).WithPolicy(policy.Policy{LeaseDuration: time.Minute})
		}, "WithPolicy(Policy.LeaseDuration)", "no effect in the one-transaction mode"},
		{"a scope no store holds", func() *receiver.Builder { return receiver.New(st).WithScope("a\x00b") }, "WithScope", "NUL"},
		{"nil dead-letter publisher", func() *receiver.Builder { return receiver.New(st).WithDeadLetter(nil, "dead") }, "WithDeadLetter", "publisher"},
		{"empty dead-letter topic", func() *receiver.Builder {
			return receiver.New(st).WithDeadLetter(gochannel.NewGoChannel(gochannel.Config{}, nil), "")
		}, "WithDeadLetter", "topic"},
		{"a scope fixed and computed", func() *receiver.Builder {
			return receiver.New(st).WithScope("orders").WithScopeFunc(func(*message.Message) (string, error) { return "t", nil })
		}, "WithScope and WithScopeFunc", "keep one"},
		{"nil scope function", func() *receiver.Builder { return receiver.New(st).WithScopeFunc(nil) }, "WithScopeFunc", "nil"},
		{"retention for no handler", func() *receiver.Builder { return receiver.New(st).WithRetentionFor("", time.Hour, 0) }, "WithRetentionFor", "handler name is empty"},
		{"negative retention", func() *receiver.Builder { return receiver.New(st).WithRetentionFor("payments", 0, -time.Hour) }, "WithRetentionFor", "must be positive"},
		{"retention that changes nothing", func() *receiver.Builder { return receiver.New(st).WithRetentionFor("payments", 0, 0) }, "WithRetentionFor", "both TTLs are 0"},
		{"retention given twice for a handler", func() *receiver.Builder {
			return receiver.New(st).WithRetentionFor("payments", time.Hour, 0).WithRetentionFor("payments", 0, time.Hour)
		}, "WithRetentionFor", "given twice"},
		{"a poison message would hold up a Kafka partition", func() *receiver.Builder {
			return receiver.New(st).WithMessagingSystem(semconv.MessagingSystemKafka)
		}, "WithPolicy(Policy.Exhausted)", "WithDeadLetter"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, err := tc.build().Build()
			var ce *oncemill.ConfigError
			if r != nil || !errors.Is(err, oncemill.ErrInvalidConfig) || !errors.As(err, &ce) {
				t.Fatalf("Build() = %v, %v; want a *oncemill.ConfigError", r, err)
			}
			if ce.Setting != tc.setting || !strings.Contains(ce.Problem, tc.says) {
				t.Fatalf("Build() error names %q saying %q; want %q saying %q", ce.Setting, ce.Problem, tc.setting, tc.says)
			}
		})
	}
}

// The builder assembles every stage, and the defaults need no configuration.
func TestBuildFullChainWithDefaults(t *testing.T) {
	t.Parallel()
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
		WithRetry(pipeline.RetryConfig{}).
		WithCircuitBreaker(gobreaker.Settings{}).
		WithEventHandler(func(e pipeline.Event) { outcomes = append(outcomes, e.Outcome) }).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })
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
	t.Parallel()
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	for name, scope := range map[string]string{
		"a NUL byte":    "s\x00x",
		"invalid UTF-8": "s\xff",
		"2,000 bytes":   strings.Repeat("s", 2000),
	} {
		r, err := receiver.New(st).WithScope(scope).Build()
		if r != nil || !errors.Is(err, oncemill.ErrInvalidConfig) || !strings.Contains(err.Error(), "store.MaxScopeLen") {
			t.Errorf("%s: Build = %v, %v; want ErrInvalidConfig saying what a scope may be", name, r, err)
		}
	}
}

// keygen.NoFingerprint turns mismatch detection off: the same key with
// another payload is a duplicate, not a mismatch.
func TestNoFingerprintTurnsMismatchDetectionOff(t *testing.T) {
	t.Parallel()
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	var outcomes []pipeline.Outcome
	for _, fingerprint := range []func(*message.Message) string{nil, keygen.NoFingerprint} {
		b := receiver.New(st).WithScope(fmt.Sprintf("fp-%v", fingerprint == nil)).
			WithEventHandler(func(e pipeline.Event) { outcomes = append(outcomes, e.Outcome) })
		if fingerprint != nil {
			b = b.WithFingerprint(fingerprint)
		}
		r, err := b.Build()
		if err != nil {
			t.Fatal(err)
		}
		h := r.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
		_, _ = h(message.NewMessage("order-1", []byte(`{"amount":1}`)))
		_, _ = h(message.NewMessage("order-1", []byte(`{"amount":2}`)))
	}
	want := []pipeline.Outcome{pipeline.OutcomeExecuted, pipeline.OutcomeRejected, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed}
	if fmt.Sprint(outcomes) != fmt.Sprint(want) {
		t.Fatalf("outcomes %v, want %v: a mismatch with the payload fingerprint, a replay without it", outcomes, want)
	}
}

// On Kafka and RabbitMQ the receiver is built once a poison message has
// somewhere to go other than back in front of the others: a dead letter, or
// the explicit drop. On SQS a nacked message steps aside (its visibility
// timeout) and the queue's redrive policy is the broker's own limit.
func TestBuildOnInOrderBrokersTakesADeadLetterOrTheDrop(t *testing.T) {
	t.Parallel()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	defer pubSub.Close()
	for name, b := range map[string]*receiver.Builder{
		"dead letter":           receiver.New(st).WithMessagingSystem(semconv.MessagingSystemKafka).WithDeadLetter(pubSub, "dead"),
		"drop":                  receiver.New(st).WithMessagingSystem(semconv.MessagingSystemKafka).WithPolicy(policy.Policy{Exhausted: policy.ExhaustedDrop}),
		"rabbitmq, dead letter": receiver.New(st).WithMessagingSystem(semconv.MessagingSystemRabbitMQ).WithDeadLetter(pubSub, "dead"),
		"sqs":                   receiver.New(st).WithMessagingSystem(semconv.MessagingSystemAWSSQS),
	} {
		if _, err := b.Build(); err != nil {
			t.Errorf("%s: %v", name, err)
		}
	}
}
