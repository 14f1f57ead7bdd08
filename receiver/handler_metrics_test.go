package receiver_test

import (
	"maps"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/receiver"
)

// One receiver on two Watermill handlers: the decision and outcome counts
// and the handler's duration carry the handler's name, so that each
// handler's replay rate can be read apart.
func TestMetricsCarryTheHandler(t *testing.T) {
	own := teltest.New(t)
	r, err := receiver.New(telStore(t)).WithMeterProvider(own.MeterProvider).WithTracerProvider(own.TracerProvider).Build()
	if err != nil {
		t.Fatal(err)
	}
	noop := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	payments := startTelRouter(t, r, "payments-handler", "payments", noop)
	emails := startTelRouter(t, r, "emails-handler", "emails", noop)
	payments.deliver("payments", message.NewMessage("p1", []byte("pay")))
	payments.deliver("payments", message.NewMessage("p1", []byte("pay"))) // a duplicate
	emails.deliver("emails", message.NewMessage("e1", []byte("mail")))

	ms := own.Metrics(t)
	byHandler := func(name, key string) map[[2]string]int64 {
		out := map[[2]string]int64{}
		for _, dp := range ms[name].Data.(metricdata.Sum[int64]).DataPoints {
			out[[2]string{teltest.Attr(dp.Attributes, "handler"), teltest.Attr(dp.Attributes, key)}] += dp.Value
		}
		return out
	}
	if got, want := byHandler("oncemill.decisions", "decision"), map[[2]string]int64{
		{"payments-handler", "execute"}: 1, {"payments-handler", "replay"}: 1, {"emails-handler", "execute"}: 1,
	}; !maps.Equal(got, want) {
		t.Errorf("decisions by handler %v, want %v", got, want)
	}
	if got, want := byHandler("oncemill.outcomes", "outcome"), map[[2]string]int64{
		{"payments-handler", "executed"}: 1, {"payments-handler", "replayed"}: 1, {"emails-handler", "executed"}: 1,
	}; !maps.Equal(got, want) {
		t.Errorf("outcomes by handler %v, want %v", got, want)
	}
	if got, want := teltest.HistCounts(t, ms, "oncemill.handler.duration", "handler"), map[string]uint64{"payments-handler": 1, "emails-handler": 1}; !maps.Equal(got, want) {
		t.Errorf("handler durations by handler %v, want %v", got, want)
	}
}
