package receiver_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

// Each replay is logged at the chosen level with its original outcome and
// age, and oncemill.replay.age tells replays of successes from replays of
// cached failures.
func TestReplaysAreLoggedAndMeasured(t *testing.T) {
	t.Parallel()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sdk := newTelSDK(t)
	logs := watermill.NewCaptureLogger()
	declined := errors.New("card declined")
	r, err := receiver.New(st).
		WithScope("payments").
		WithPolicy(receiver.Policy{CachedErrors: []error{declined}}).
		WithLogger(logs).
		WithReplayLogLevel(watermill.InfoLogLevel).
		WithMeterProvider(sdk.mp).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	h := r.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if m.UUID == "pay-declined" {
			return nil, declined
		}
		return nil, nil
	})
	for _, uuid := range []string{"pay-ok", "pay-ok", "pay-declined", "pay-declined", "pay-declined"} {
		_, _ = h(message.NewMessage(uuid, []byte("{}")))
	}

	infos := logs.Captured()[watermill.InfoLogLevel]
	byOriginal := map[string]int{}
	for _, m := range infos {
		if m.Msg != "Duplicate replayed; the handler did not run" {
			continue
		}
		if m.Fields["scope"] != "payments" || m.Fields["age"] == "" || m.Fields["original_attempt"] != 1 {
			t.Errorf("replay logged with fields %v", m.Fields)
		}
		byOriginal[m.Fields["original"].(string)+"/"+m.Fields["key"].(string)]++
	}
	if byOriginal["succeeded/pay-ok"] != 1 || byOriginal["failed/pay-declined"] != 2 || len(byOriginal) != 2 {
		t.Fatalf("replays logged by original outcome and key: %v, want 1 succeeded/pay-ok and 2 failed/pay-declined", byOriginal)
	}

	var rm metricdata.ResourceMetrics
	if err := sdk.reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	counts := map[string]uint64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "oncemill.replay.age" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
				v, _ := dp.Attributes.Value(attribute.Key("original"))
				counts[v.Emit()] += dp.Count
			}
		}
	}
	if counts["succeeded"] != 1 || counts["failed"] != 2 {
		t.Fatalf("oncemill.replay.age counts by original: %v, want succeeded 1 and failed 2", counts)
	}
}

func TestReplayLogLevelMustBeALevel(t *testing.T) {
	t.Parallel()
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	if _, err := receiver.New(st).WithReplayLogLevel(9).Build(); !errors.Is(err, receiver.ErrInvalidConfig) {
		t.Fatalf("Build with replay log level 9 = %v, want ErrInvalidConfig", err)
	}
}
