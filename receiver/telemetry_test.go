package receiver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

func telStore(t *testing.T) *memory.Store {
	t.Helper()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// telRouter runs one gochannel router with one handler guarded by a
// receiver, so the subscribe topic and handler name are in the context.
type telRouter struct {
	t      *testing.T
	pubSub *gochannel.GoChannel
	done   atomic.Int32 // deliveries the chain returned from
}

func startTelRouter(t *testing.T, r *receiver.Receiver, handler, topic string, h message.HandlerFunc) *telRouter {
	t.Helper()
	tr := &telRouter{t: t, pubSub: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})}
	router, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	hd := router.AddConsumerHandler(handler, topic, tr.pubSub, func(m *message.Message) error {
		_, err := h(m)
		return err
	})
	// Added first, so it runs outermost: it counts a delivery once the whole
	// chain, the delivery span included, is done with it.
	hd.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			defer tr.done.Add(1)
			return next(m)
		}
	}, r.Middleware)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = router.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped; _ = tr.pubSub.Close() })
	<-router.Running()
	return tr
}

// deliver publishes m and waits until the chain has returned from it.
func (tr *telRouter) deliver(topic string, m *message.Message) {
	tr.t.Helper()
	n := tr.done.Load()
	if err := tr.pubSub.Publish(topic, m); err != nil {
		tr.t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for tr.done.Load() == n {
		if time.Now().After(deadline) {
			tr.t.Fatalf("%s was not handled within 10s", m.UUID)
		}
		time.Sleep(time.Millisecond)
	}
}

// installGlobalSDK makes a fresh SDK the global providers for the test, and
// puts no-op providers back afterwards.
func installGlobalSDK(t *testing.T) *teltest.Kit {
	t.Helper()
	g := teltest.New(t)
	otel.SetTracerProvider(g.TracerProvider)
	otel.SetMeterProvider(g.MeterProvider)
	t.Cleanup(func() {
		otel.SetTracerProvider(tracenoop.NewTracerProvider())
		otel.SetMeterProvider(metricnoop.NewMeterProvider())
	})
	return g
}

func telRetry() pipeline.RetryConfig {
	cfg := pipeline.RetryConfig{}
	cfg.InitialInterval, cfg.MaxInterval, cfg.RandomizationFactor = time.Millisecond, time.Millisecond, -1
	return cfg
}

func telBreaker() gobreaker.Settings {
	return gobreaker.Settings{Name: "orders-db"}
}

func telValidate(m *message.Message) error {
	if string(m.Payload) == "bad" {
		return errors.New("amount missing")
	}
	return nil
}

// Spans and metrics go to the providers given to the builder, not to the
// global ones, even when a global SDK is installed; the span carries the
// messaging system given to WithMessagingSystem.
func TestReceiverTelemetryUsesTheBuilderProviders(t *testing.T) {
	global := installGlobalSDK(t)
	own := teltest.New(t)
	r, err := receiver.New(telStore(t)).
		WithTracerProvider(own.TracerProvider).
		WithMeterProvider(own.MeterProvider).
		WithMessagingSystem(semconv.MessagingSystemAWSSQS).
		WithValidation(telValidate).
		WithRetry(telRetry()).
		WithCircuitBreaker(telBreaker()).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	tr := startTelRouter(t, r, "orders-handler", "orders", func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			return nil, errors.New("database briefly unavailable")
		}
		return nil, nil
	})
	tr.deliver("orders", message.NewMessage("o1", []byte("ok")))
	tr.deliver("orders", message.NewMessage("o1", []byte("ok")))
	tr.deliver("orders", message.NewMessage("o2", []byte("bad")))

	if n := len(global.Spans.Ended()); n != 0 {
		t.Errorf("%d spans reached the global provider, want 0", n)
	}
	if names := global.MetricNames(t); len(names) != 0 {
		t.Errorf("metrics reached the global provider: %v", names)
	}

	spans := own.Named("process orders")
	if len(spans) != 3 {
		t.Fatalf("%d delivery spans in the builder's provider, want 3", len(spans))
	}
	for i, want := range []struct{ id, decision string }{{"o1", "execute"}, {"o1", "replay"}, {"o2", ""}} {
		attrs := map[string]string{}
		for _, kv := range spans[i].Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		if spans[i].SpanKind() != trace.SpanKindConsumer || attrs["messaging.system"] != "aws_sqs" ||
			attrs["messaging.destination.name"] != "orders" || attrs["messaging.message.id"] != want.id ||
			attrs["messaging.operation.name"] != "process" || attrs["messaging.operation.type"] != "process" {
			t.Errorf("delivery %d: kind %v attributes %v", i, spans[i].SpanKind(), attrs)
		}
		if attrs["idempotency.decision"] != want.decision {
			t.Errorf("delivery %d: decision %q, want %q", i, attrs["idempotency.decision"], want.decision)
		}
		if want.decision != "" && attrs["idempotency.scope"] != "orders-handler" {
			t.Errorf("delivery %d: scope %q, want the handler name", i, attrs["idempotency.scope"])
		}
		if want.decision == "" {
			// An invalid message never reaches the idempotency stage.
			for k := range attrs {
				if strings.HasPrefix(k, "idempotency.") {
					t.Errorf("invalid message's span has %s", k)
				}
			}
		}
	}
	if got := teltest.Sums(t, own.Metrics(t), "oncemill.decisions", "decision"); !maps.Equal(got, map[string]int64{"execute": 1, "replay": 1}) {
		t.Errorf("decisions %v", got)
	}
	if got := teltest.Sums(t, own.Metrics(t), "oncemill.retries", ""); !maps.Equal(got, map[string]int64{"": 1}) {
		t.Errorf("retries %v, want 1", got)
	}
	if got := teltest.Sums(t, own.Metrics(t), "oncemill.validation.invalid", ""); !maps.Equal(got, map[string]int64{"": 1}) {
		t.Errorf("validation.invalid %v, want 1", got)
	}
	if got := teltest.Gauge[int64](t, own.Metrics(t), "oncemill.breaker.state", "breaker"); !maps.Equal(got, map[string]int64{"orders-db": 0}) {
		t.Errorf("breaker.state %v, want orders-db closed", got)
	}
}

// Without WithTracerProvider or WithMeterProvider, spans and metrics go to
// the global providers: one delivery span per delivery, with the store's
// child spans under it.
func TestReceiverTelemetryDefaultsToTheGlobalProviders(t *testing.T) {
	global := installGlobalSDK(t)
	r, err := receiver.New(telStore(t)).WithScope("orders").Build()
	if err != nil {
		t.Fatal(err)
	}
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for range 2 {
		if _, err := h(message.NewMessage("o1", []byte("ok"))); err != nil {
			t.Fatal(err)
		}
	}
	if got := teltest.Sums(t, global.Metrics(t), "oncemill.decisions", "decision"); !maps.Equal(got, map[string]int64{"execute": 1, "replay": 1}) {
		t.Errorf("global decisions %v", got)
	}
	// Two delivery spans; begin+complete under the first, begin under the replay.
	var deliveries, stores int
	for _, sp := range global.Spans.Ended() {
		switch {
		case sp.Name() == "process":
			deliveries++
		case strings.HasPrefix(sp.Name(), "oncemill.store."):
			stores++
		}
	}
	if deliveries != 2 || stores != 3 {
		t.Errorf("%d delivery spans and %d store spans in the global provider, want 2 and 3", deliveries, stores)
	}
}

// The lease mode claims, then records the success after the handler:
// oncemill.store.begin and .complete, children of the delivery span.
func TestReceiverTelemetryLeaseModeStoreSpans(t *testing.T) {
	t.Parallel()
	own := teltest.New(t)
	r, err := receiver.New(telStore(t)).
		WithTracerProvider(own.TracerProvider).
		WithMeterProvider(own.MeterProvider).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	tr := startTelRouter(t, r, "orders-handler", "orders", func(*message.Message) ([]*message.Message, error) { return nil, nil })
	tr.deliver("orders", message.NewMessage("o1", []byte("ok")))
	delivery := own.Named("process orders")
	if len(delivery) != 1 {
		t.Fatalf("%d delivery spans", len(delivery))
	}
	var children []string
	for _, s := range own.Spans.Ended() {
		if s.Parent().SpanID() == delivery[0].SpanContext().SpanID() {
			children = append(children, s.Name())
		}
	}
	if strings.Join(children, ",") != "oncemill.store.begin,oncemill.store.complete" {
		t.Fatalf("children of the delivery span: %v", children)
	}
	attrs := map[string]string{}
	for _, kv := range delivery[0].Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	if attrs["messaging.system"] != "watermill" {
		t.Fatalf("messaging.system %q, want the default watermill", attrs["messaging.system"])
	}
}

// Durations in seconds want sub-millisecond to ten-second buckets; the SDK's
// default boundaries (0, 5, 10, ... 10000) suit milliseconds. The view
// docs/observability.md recommends.
func telDurationView() sdkmetric.View {
	return sdkmetric.NewView(
		sdkmetric.Instrument{Name: "oncemill.*.duration"},
		sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{
			Boundaries: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
		}},
	)
}

// The Prometheus names the PromQL in docs/observability.md uses: the
// exporter replaces dots by underscores, appends the unit (_seconds) and
// _total to counters, drops {annotation} units, and keeps the attributes as
// labels.
func TestReceiverPrometheusNames(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp), sdkmetric.WithView(telDurationView()))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	dead := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = dead.Close() })
	dl, err := dead.Subscribe(context.Background(), "dead")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for m := range dl {
			m.Ack()
		}
	}()
	r, err := receiver.New(telStore(t)).
		WithMeterProvider(mp).
		WithScope("orders").
		WithValidation(telValidate).
		WithRetry(telRetry()).
		WithCircuitBreaker(telBreaker()).
		WithDeadLetter(dead, "dead").
		WithPolicy(policy.Policy{MaxAttempts: 1}).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	var calls atomic.Int32
	h := r.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 || string(m.Payload) == "poison" {
			return nil, errors.New("database briefly unavailable")
		}
		return nil, nil
	})
	for _, m := range []*message.Message{
		message.NewMessage("o1", []byte("ok")),
		message.NewMessage("o1", []byte("ok")),
		message.NewMessage("o1", []byte("changed")), // mismatch: dead-lettered
		message.NewMessage("o2", []byte("bad")),     // invalid
		message.NewMessage("o3", []byte("poison")),  // its one attempt fails: dead-lettered
	} {
		if _, err := h(m); err != nil {
			t.Fatal(err)
		}
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, f := range families {
		got[f.GetName()] = f
	}
	for name, want := range map[string]struct {
		typ   dto.MetricType
		label string // one label every series has ("" for none)
	}{
		"oncemill_decisions_total":          {dto.MetricType_COUNTER, "decision"},
		"oncemill_outcomes_total":           {dto.MetricType_COUNTER, "outcome"},
		"oncemill_retries_total":            {dto.MetricType_COUNTER, ""},
		"oncemill_validation_invalid_total": {dto.MetricType_COUNTER, ""},
		"oncemill_dead_letters_total":       {dto.MetricType_COUNTER, "reason"},
		"oncemill_attempts_exhausted_total": {dto.MetricType_COUNTER, "action"},
		"oncemill_store_duration_seconds":   {dto.MetricType_HISTOGRAM, "operation"},
		"oncemill_handler_duration_seconds": {dto.MetricType_HISTOGRAM, ""},
		"oncemill_leases_live":              {dto.MetricType_GAUGE, ""},
		"oncemill_breaker_state":            {dto.MetricType_GAUGE, "breaker"},
	} {
		f, ok := got[name]
		if !ok {
			var names []string
			for n := range got {
				names = append(names, n)
			}
			sort.Strings(names)
			t.Errorf("no %s among %v", name, names)
			continue
		}
		if f.GetType() != want.typ {
			t.Errorf("%s: type %v, want %v", name, f.GetType(), want.typ)
		}
		for _, m := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if want.label != "" && labels[want.label] == "" {
				t.Errorf("%s: series %v has no %s label", name, labels, want.label)
			}
			if name == "oncemill_decisions_total" && labels["decision"] == "replay" && m.GetCounter().GetValue() != 1 {
				t.Errorf("%s{decision=replay} = %v, want 1", name, m.GetCounter().GetValue())
			}
			if name == "oncemill_breaker_state" && (labels["breaker"] != "orders-db" || m.GetGauge().GetValue() != 0) {
				t.Errorf("%s %v = %v, want orders-db 0", name, labels, m.GetGauge().GetValue())
			}
			if name == "oncemill_store_duration_seconds" {
				if b := m.GetHistogram().GetBucket(); len(b) == 0 || b[0].GetUpperBound() != 0.0005 {
					t.Errorf("%s: buckets %v, want the view's boundaries", name, b)
				}
			}
		}
	}
}

// telJSONLines decodes the lines a slog.JSONHandler wrote.
func telJSONLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// telSyncBuffer is a bytes.Buffer safe for the concurrent writes of a
// handler and its heartbeat.
type telSyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *telSyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *telSyncBuffer) lines(t *testing.T) []map[string]any {
	b.mu.Lock()
	defer b.mu.Unlock()
	return telJSONLines(t, &b.buf)
}

// WithSlog: oncemill's log lines reach the slog logger, a permanent failure
// and a rejected message at error level with the delivery's fields.
func TestReceiverLogsThroughSlog(t *testing.T) {
	t.Parallel()
	var out telSyncBuffer
	logger := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := receiver.New(telStore(t)).WithScope("payments").WithLogger(logger).Build()
	if err != nil {
		t.Fatal(err)
	}
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, policy.Cached(errors.New("card declined"))
	})
	for _, m := range []*message.Message{
		message.NewMessage("pay-1", []byte("12.00 EUR")),
		message.NewMessage("pay-1", []byte("13.00 EUR")), // mismatch
	} {
		if _, err := h(m); err != nil {
			t.Fatal(err)
		}
	}
	var lines []map[string]any // the debug lines of each execution's progress aside
	for _, l := range out.lines(t) {
		if l["level"] != "DEBUG" {
			lines = append(lines, l)
		}
	}
	if len(lines) != 2 {
		t.Fatalf("%d log lines above debug, want 2: %v", len(lines), lines)
	}
	for i, want := range []struct{ msg, err string }{
		{"Handler failed permanently; the failure is cached and the message acked", "card declined"},
		{"Message rejected as a permanent failure; it is acked and not run", "key reused with a different payload"},
	} {
		l := lines[i]
		if l["level"] != "ERROR" || l["msg"] != want.msg || !strings.Contains(l["error"].(string), want.err) ||
			l["message_uuid"] != "pay-1" || l["scope"] != "payments" || l["key"] != "pay-1" {
			t.Errorf("line %d: %v, want %q with error %q and the delivery's fields", i, l, want.msg, want.err)
		}
	}
	if lines[0]["attempt"] != float64(1) {
		t.Errorf("attempt %v, want 1", lines[0]["attempt"])
	}
}

// WithLogger: the same line through any slog.Handler, with the attempt as
// an int and the error as the handler's error.
func TestReceiverLogsTheHandlersError(t *testing.T) {
	t.Parallel()
	logs := &testenv.Logs{}
	r, err := receiver.New(telStore(t)).WithScope("payments").WithLogger(slog.New(logs)).Build()
	if err != nil {
		t.Fatal(err)
	}
	declined := errors.New("card declined")
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, policy.Cached(declined) })
	if _, err := h(message.NewMessage("pay-1", []byte("12.00 EUR"))); err != nil {
		t.Fatal(err)
	}
	errs := logs.At(slog.LevelError)
	if len(errs) != 1 {
		t.Fatalf("captured errors %v, want 1", errs)
	}
	e := errs[0]
	lerr, _ := e.Attrs["error"].(error)
	if e.Msg != "Handler failed permanently; the failure is cached and the message acked" || !errors.Is(lerr, declined) ||
		e.Attrs["message_uuid"] != "pay-1" || e.Attrs["scope"] != "payments" || e.Attrs["key"] != "pay-1" || e.Attrs["attempt"] != int64(1) {
		t.Fatalf("captured %+v", e)
	}
}

// Example_observability is the wiring docs/observability.md shows: an SDK
// tracer provider (here with an in-memory exporter standing in for OTLP) and
// a meter provider with the Prometheus exporter and the duration buckets,
// passed to the builder. One message delivered twice leaves a consumer span
// per delivery, each with its decision.
func Example_observability() {
	ctx := context.Background()
	spanExporter := tracetest.NewInMemoryExporter() // e.g. otlptracegrpc.New(ctx)

	exporter, err := otelprom.New(otelprom.WithRegisterer(prometheus.NewRegistry())) // or the default registry
	if err != nil {
		panic(err)
	}
	mp := sdkmetric.NewMeterProvider(
		sdkmetric.WithReader(exporter),
		sdkmetric.WithView(sdkmetric.NewView(
			sdkmetric.Instrument{Name: "oncemill.*.duration"},
			sdkmetric.Stream{Aggregation: sdkmetric.AggregationExplicitBucketHistogram{
				Boundaries: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10},
			}},
		)),
	)
	defer mp.Shutdown(ctx)
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spanExporter)) // WithBatcher in production
	defer tp.Shutdown(ctx)

	st, err := memory.New(memory.Options{})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	r, err := receiver.New(st).
		WithScope("payments").
		WithTracerProvider(tp).
		WithMeterProvider(mp).
		WithMessagingSystem(semconv.MessagingSystemAWSSQS).
		WithLogger(slog.Default()).
		Build()
	if err != nil {
		panic(err)
	}
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for range 2 {
		if _, err := h(message.NewMessage("pay-1", []byte("12.00 EUR"))); err != nil {
			panic(err)
		}
	}
	for _, span := range spanExporter.GetSpans() {
		if span.SpanKind != trace.SpanKindConsumer {
			continue
		}
		for _, a := range span.Attributes {
			if a.Key == "idempotency.decision" {
				fmt.Println(span.Name, a.Value.Emit())
			}
		}
	}
	// Output:
	// process execute
	// process replay
}
