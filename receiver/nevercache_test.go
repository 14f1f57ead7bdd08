package receiver_test

import (
	"log/slog"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

// policy.NeverCacheFailures asks on purpose for what Build refuses by
// default on Kafka and RabbitMQ: a message that always fails is never
// acked. Build takes it there, without a dead letter too, and says once,
// at warn level, what it costs; on SQS, whose redrive policy ends the
// loop, it says nothing.
func TestBuildWarnsOfNeverCacheFailuresOnInOrderBrokers(t *testing.T) {
	t.Parallel()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for system, warns := range map[attribute.KeyValue]bool{
		semconv.MessagingSystemKafka:    true,
		semconv.MessagingSystemRabbitMQ: true,
		semconv.MessagingSystemAWSSQS:   false,
	} {
		logs, logger := testenv.NewLogs()
		_, err := receiver.New(st).WithMessagingSystem(system).WithLogger(logger).
			WithPolicy(policy.Policy{NeverCacheFailures: true}).Build()
		if err != nil {
			t.Errorf("%s: %v", system.Value.AsString(), err)
		}
		got := logs.At(slog.LevelWarn)
		if warns != (len(got) == 1) || warns && (!strings.Contains(got[0].Msg, "NeverCacheFailures") || got[0].Attrs["messaging_system"] != system.Value.AsString()) {
			t.Errorf("%s: warnings %+v, want one naming the setting: %v", system.Value.AsString(), got, warns)
		}
	}
}
