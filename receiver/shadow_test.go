package receiver_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/oncemill/oncemill/receiver"
)

// WithShadow(true) runs the handler for a duplicate and counts it as
// oncemill_shadow_duplicates_total{decision} in Prometheus (the name
// docs/operations.md's PromQL uses); WithShadow(false) over the same store
// enforces again: the duplicate is replayed without running.
func TestWithShadow(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	st := telStore(t)
	var runs atomic.Int32
	handler := func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil }

	shadow, err := receiver.New(st).WithScope("orders").WithMeterProvider(mp).WithShadow(true).Build()
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := shadow.Middleware(handler)(message.NewMessage("o1", []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 3 {
		t.Fatalf("shadow: %d runs for 3 deliveries of one message, want 3", runs.Load())
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var counted float64
	for _, f := range families {
		if f.GetName() != "oncemill_shadow_duplicates_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "decision" && l.GetValue() == "replay" {
					counted += m.GetCounter().GetValue()
				}
			}
		}
	}
	if counted != 2 {
		t.Fatalf("oncemill_shadow_duplicates_total{decision=\"replay\"} = %v, want 2", counted)
	}

	enforcing, err := receiver.New(st).WithScope("orders").WithShadow(true).WithShadow(false).Build()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enforcing.Middleware(handler)(message.NewMessage("o1", []byte("x"))); err != nil || runs.Load() != 3 {
		t.Fatalf("enforcing: %v after %d runs, want the duplicate replayed without a run", err, runs.Load())
	}
}
