// Package teltest is the telemetry test kit of this repository's own
// tests, and nothing else: it is not part of oncemill's API, and may change
// at any time. A Kit is an OpenTelemetry SDK reduced to what a test reads:
// a span recorder behind a TracerProvider and a manual reader behind a
// MeterProvider; the functions read what it recorded.
package teltest

import (
	"context"
	"maps"
	"slices"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Kit is an SDK whose spans and metrics a test reads. Its providers shut
// down when the test ends.
type Kit struct {
	Spans          *tracetest.SpanRecorder
	Reader         *sdkmetric.ManualReader
	TracerProvider *sdktrace.TracerProvider
	MeterProvider  *sdkmetric.MeterProvider
}

// New returns a fresh Kit for the test.
func New(tb testing.TB) *Kit {
	tb.Helper()
	k := &Kit{Spans: tracetest.NewSpanRecorder(), Reader: sdkmetric.NewManualReader()}
	k.TracerProvider = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(k.Spans))
	k.MeterProvider = sdkmetric.NewMeterProvider(sdkmetric.WithReader(k.Reader))
	tb.Cleanup(func() {
		_ = k.TracerProvider.Shutdown(context.Background())
		_ = k.MeterProvider.Shutdown(context.Background())
	})
	return k
}

// Named returns the ended spans called name, in the order they ended.
func (k *Kit) Named(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range k.Spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// Collect reads every metric, failing the test if the reader cannot.
func (k *Kit) Collect(tb testing.TB) metricdata.ResourceMetrics {
	tb.Helper()
	var rm metricdata.ResourceMetrics
	if err := k.Reader.Collect(context.Background(), &rm); err != nil {
		tb.Fatal(err)
	}
	return rm
}

// Metrics reads every metric, by name, whatever its instrumentation scope.
func (k *Kit) Metrics(tb testing.TB) map[string]metricdata.Metrics {
	tb.Helper()
	return ByName(k.Collect(tb))
}

// MetricNames lists the names of every metric the reader holds, sorted.
func (k *Kit) MetricNames(tb testing.TB) []string {
	tb.Helper()
	return slices.Sorted(maps.Keys(k.Metrics(tb)))
}

// ByName is the metrics of rm by name, whatever their scope.
func ByName(rm metricdata.ResourceMetrics) map[string]metricdata.Metrics {
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// Attr is a data point's value of attribute key ("" when absent).
func Attr(set attribute.Set, key string) string {
	v, _ := set.Value(attribute.Key(key))
	return v.Emit()
}

// Sums returns an int64 sum's data points added up by the value of key
// (all under "" when key is ""); a metric never recorded gives an empty
// map, a metric of another kind fails the test.
func Sums(tb testing.TB, ms map[string]metricdata.Metrics, name, key string) map[string]int64 {
	tb.Helper()
	out := map[string]int64{}
	m, ok := ms[name]
	if !ok {
		return out
	}
	sum, ok := m.Data.(metricdata.Sum[int64])
	if !ok {
		tb.Fatalf("%s is a %T, want an int64 sum", name, m.Data)
	}
	for _, dp := range sum.DataPoints {
		out[Attr(dp.Attributes, key)] += dp.Value
	}
	return out
}

// HistCounts returns a float64 histogram's counts by the value of key.
func HistCounts(tb testing.TB, ms map[string]metricdata.Metrics, name, key string) map[string]uint64 {
	tb.Helper()
	out := map[string]uint64{}
	m, ok := ms[name]
	if !ok {
		return out
	}
	h, ok := m.Data.(metricdata.Histogram[float64])
	if !ok {
		tb.Fatalf("%s is a %T, want a float64 histogram", name, m.Data)
	}
	for _, dp := range h.DataPoints {
		out[Attr(dp.Attributes, key)] += dp.Count
	}
	return out
}

// Gauge returns a gauge's last values by the value of key.
func Gauge[N int64 | float64](tb testing.TB, ms map[string]metricdata.Metrics, name, key string) map[string]N {
	tb.Helper()
	out := map[string]N{}
	m, ok := ms[name]
	if !ok {
		return out
	}
	g, ok := m.Data.(metricdata.Gauge[N])
	if !ok {
		tb.Fatalf("%s is a %T, want a %T", name, m.Data, metricdata.Gauge[N]{})
	}
	for _, dp := range g.DataPoints {
		out[Attr(dp.Attributes, key)] = dp.Value
	}
	return out
}

// SpanAttrs is the attributes of s by key.
func SpanAttrs(s sdktrace.ReadOnlySpan) map[string]attribute.Value {
	out := map[string]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[string(kv.Key)] = kv.Value
	}
	return out
}
