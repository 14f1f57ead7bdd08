package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"regexp"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// instrumentationName names oncemill's tracer and meter: the
// instrumentation scope of every span and metric it records.
const instrumentationName = "github.com/oncemill/oncemill"

// telKit is teltest's SDK, for a stage to record into (use).
type telKit struct {
	*teltest.Kit
}

func newTelKit(t *testing.T) *telKit {
	t.Helper()
	return &telKit{Kit: teltest.New(t)}
}

// use makes the stage configured by c record into the kit, as a Kafka
// consumer.
func (k *telKit) use(c *idempotency.Config) {
	c.TracerProvider, c.MeterProvider, c.MessagingSystem = k.TracerProvider, k.MeterProvider, "kafka"
}

// deliveries returns the ended delivery spans (kind Consumer). Outside a
// router the topic is empty, so they are found by kind, not by name.
func (k *telKit) deliveries() []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range k.Spans.Ended() {
		if s.SpanKind() == trace.SpanKindConsumer {
			out = append(out, s)
		}
	}
	return out
}

// storeSpanNames lists the oncemill.store.* spans whose parent is the span
// with context parent, in the order they ended.
func (k *telKit) storeSpanNames(parent trace.SpanContext) []string {
	var out []string
	for _, s := range k.Spans.Ended() {
		if strings.HasPrefix(s.Name(), "oncemill.store.") && s.Parent().SpanID() == parent.SpanID() && s.Parent().TraceID() == parent.TraceID() {
			out = append(out, s.Name())
		}
	}
	return out
}

// collect reads every metric, by name, and checks that each comes from
// oncemill's instrumentation scope.
func (k *telKit) collect(t *testing.T) map[string]metricdata.Metrics {
	t.Helper()
	rm := k.Collect(t)
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != instrumentationName {
			t.Errorf("instrumentation scope %q, want %q", sm.Scope.Name, instrumentationName)
		}
	}
	return teltest.ByName(rm)
}

// telRun delivers m through h and returns the error the router would see.
func telRun(h message.HandlerFunc, m *message.Message) error {
	_, err := h(m)
	return err
}

func telNoop(*message.Message) ([]*message.Message, error) { return nil, nil }

// The delivery span, run through a real gochannel router so the subscribe
// topic is in the message context: its name, kind, every attribute, and the
// store spans under it.
func TestTelemetryDeliverySpanThroughRouter(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) {
		c.Scope = "" // the Watermill handler name
		k.use(&c.Config)
	})
	rr := newRouterRun(t)
	handler := rr.router.AddConsumerHandler("payments", "payments.in", rr.pubSub, func(*message.Message) error { return nil })
	handler.AddMiddleware(h.stage.Middleware)
	rr.start()

	long := strings.Repeat("k", 500)
	deliveries := []*message.Message{msg("m1", "x"), msg("m1", "x"), msg(long, "x")}
	for i, m := range deliveries {
		rr.publish("payments.in", m)
		testenv.WaitFor(t, 10*time.Second, fmt.Sprintf("delivery span %d", i+1), func() bool { return len(k.Named("process payments.in")) == i+1 })
	}

	spans := k.Named("process payments.in")
	hashed := keygen.StorableKey(long, 128)
	if !strings.HasPrefix(hashed, "hashed:sha256:") || len(hashed) != 78 {
		t.Fatalf("keygen.StorableKey(500 bytes, 128) = %q", hashed)
	}
	want := []struct {
		uuid, key, decision, outcome string
		attempt                      int64   // 0: attribute absent
		ttl                          float64 // 0: attribute absent
		storeSpans                   []string
	}{
		{"m1", "m1", "execute", "executed", 1, 86400, []string{"oncemill.store.begin", "oncemill.store.complete"}},
		{"m1", "m1", "replay", "replayed", 0, 0, []string{"oncemill.store.begin"}},
		{long, hashed, "execute", "executed", 1, 86400, []string{"oncemill.store.begin", "oncemill.store.complete"}},
	}
	for i, w := range want {
		s := spans[i]
		if s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("delivery %d: kind %v, want consumer", i, s.SpanKind())
		}
		if s.Parent().IsValid() {
			t.Errorf("delivery %d: parent %v, want a root span (nothing upstream in the context)", i, s.Parent())
		}
		if s.Status().Code != codes.Unset {
			t.Errorf("delivery %d: status %v, want unset for an acked delivery", i, s.Status())
		}
		if s.InstrumentationScope().Name != instrumentationName {
			t.Errorf("delivery %d: scope %q", i, s.InstrumentationScope().Name)
		}
		attrs := teltest.SpanAttrs(s)
		wantAttrs := map[string]string{
			"messaging.system":           "kafka",
			"messaging.destination.name": "payments.in",
			"messaging.message.id":       w.uuid,
			"messaging.operation.name":   "process",
			"messaging.operation.type":   "process",
			"idempotency.key":            w.key,
			"idempotency.scope":          "payments",
			"idempotency.decision":       w.decision,
			"idempotency.outcome":        w.outcome,
		}
		for name, v := range wantAttrs {
			if got, ok := attrs[name]; !ok || got.Type() != attribute.STRING || got.AsString() != v {
				t.Errorf("delivery %d: %s = %v (present %v), want %q", i, name, got.Emit(), ok, v)
			}
		}
		got, ok := attrs["idempotency.attempt"]
		switch {
		case w.attempt == 0 && ok:
			t.Errorf("delivery %d: idempotency.attempt = %v, want it absent on a replay", i, got.Emit())
		case w.attempt != 0 && (!ok || got.Type() != attribute.INT64 || got.AsInt64() != w.attempt):
			t.Errorf("delivery %d: idempotency.attempt = %v, want int %d", i, got.Emit(), w.attempt)
		}
		// The default policy's SuccessTTL, 24 h, once the success is stored;
		// a replay stores nothing.
		got, ok = attrs["idempotency.ttl_seconds"]
		switch {
		case w.ttl == 0 && ok:
			t.Errorf("delivery %d: idempotency.ttl_seconds = %v, want it absent on a replay", i, got.Emit())
		case w.ttl != 0 && (!ok || got.Type() != attribute.FLOAT64 || got.AsFloat64() != w.ttl):
			t.Errorf("delivery %d: idempotency.ttl_seconds = %v, want float %v", i, got.Emit(), w.ttl)
		}
		if extra := len(attrs) - len(wantAttrs); extra != 0 && !(extra == 2 && w.attempt != 0 && w.ttl != 0) {
			t.Errorf("delivery %d: unexpected attributes %v", i, attrs)
		}
		if names := k.storeSpanNames(s.SpanContext()); strings.Join(names, ",") != strings.Join(w.storeSpans, ",") {
			t.Errorf("delivery %d: store child spans %v, want %v", i, names, w.storeSpans)
		}
	}
	for _, s := range k.Spans.Ended() {
		if strings.HasPrefix(s.Name(), "oncemill.store.") && s.SpanKind() != trace.SpanKindClient {
			t.Errorf("%s: kind %v, want client", s.Name(), s.SpanKind())
		}
	}
	if n := len(k.Spans.Ended()); n != 3+2+1+2 {
		t.Errorf("%d spans in all, want 3 delivery spans and 5 store spans", n)
	}
}

// A retryable failure releases the key: begin, then release, under the
// delivery span, whose status is Error because the delivery is nacked.
func TestTelemetryReleaseSpan(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) { k.use(&c.Config) })
	errDown := errors.New("database briefly unavailable")
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		return nil, errDown
	})
	if err := telRun(handler, msg("m1", "x")); !errors.Is(err, errDown) {
		t.Fatalf("got %v, want the handler's error (nack)", err)
	}
	delivery := k.deliveries()
	if len(delivery) != 1 {
		t.Fatalf("%d delivery spans", len(delivery))
	}
	if names := k.storeSpanNames(delivery[0].SpanContext()); strings.Join(names, ",") != "oncemill.store.begin,oncemill.store.release" {
		t.Fatalf("store spans %v, want begin then release", names)
	}
	if st := delivery[0].Status(); st.Code != codes.Error || !strings.Contains(st.Description, errDown.Error()) {
		t.Fatalf("delivery span status %+v, want Error with the handler's error", st)
	}
	attrs := teltest.SpanAttrs(delivery[0])
	if attrs["idempotency.decision"].AsString() != "execute" || attrs["idempotency.outcome"].AsString() != "released" || attrs["idempotency.attempt"].AsInt64() != 1 {
		t.Fatalf("attributes %v", attrs)
	}
	ms := k.collect(t)
	if got := teltest.Sums(t, ms, "oncemill.outcomes", "outcome"); !maps.Equal(got, map[string]int64{"released": 1}) {
		t.Fatalf("outcomes %v", got)
	}
}

// A heartbeat extends the lease: oncemill.store.extend, a child of the
// delivery span even though it runs on the heartbeat's timer goroutine.
func TestTelemetryHeartbeatExtendSpan(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) {
		k.use(&c.Config)
		c.Policy.LeaseDuration = time.Minute
		c.Policy.Heartbeat = 5 * time.Millisecond
	})
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		// Wait a bit: until at least one heartbeat has fired and ended.
		testenv.WaitFor(t, 10*time.Second, "an ended extend span", func() bool { return len(k.Named("oncemill.store.extend")) > 0 })
		return nil, nil
	})
	if err := telRun(handler, msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	delivery := k.deliveries()
	if len(delivery) != 1 {
		t.Fatalf("%d delivery spans", len(delivery))
	}
	names := k.storeSpanNames(delivery[0].SpanContext())
	if len(names) < 3 || names[0] != "oncemill.store.begin" || names[len(names)-1] != "oncemill.store.complete" {
		t.Fatalf("store spans %v, want begin, extend..., complete", names)
	}
	for _, n := range names[1 : len(names)-1] {
		if n != "oncemill.store.extend" {
			t.Fatalf("store spans %v, want only extends between begin and complete", names)
		}
	}
	for _, s := range k.Named("oncemill.store.extend") {
		if s.Status().Code != codes.Unset {
			t.Fatalf("extend span status %+v", s.Status())
		}
	}
	ms := k.collect(t)
	if got := teltest.HistCounts(t, ms, "oncemill.store.duration", "operation")["extend"]; got != uint64(len(names)-2) {
		t.Fatalf("store.duration{operation=extend} count %d, want one per extend span (%d)", got, len(names)-2)
	}
}

// pipeline.CheckLease extends the lease the same way: an
// oncemill.store.extend span under the delivery span.
func TestTelemetryCheckLeaseExtendSpan(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) { k.use(&c.Config) })
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		return nil, pipeline.CheckLease(m.Context())
	})
	if err := telRun(handler, msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	delivery := k.deliveries()
	if len(delivery) != 1 {
		t.Fatalf("%d delivery spans", len(delivery))
	}
	if names := k.storeSpanNames(delivery[0].SpanContext()); strings.Join(names, ",") != "oncemill.store.begin,oncemill.store.extend,oncemill.store.complete" {
		t.Fatalf("store spans %v, want begin, extend, complete", names)
	}
}

// The stage opens its delivery span under whatever span is in the message
// context (one an upstream middleware started): the idempotency attributes
// go on the delivery span, and the store spans under it.
func TestTelemetryDeliverySpanIsAChildOfTheSpanInTheMessageContext(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) { k.use(&c.Config) })
	ctx, upstream := k.TracerProvider.Tracer("upstream").Start(context.Background(), "upstream")
	m := msg("m1", "x")
	m.SetContext(ctx)
	if err := telRun(h.stage.Middleware(telNoop), m); err != nil {
		t.Fatal(err)
	}
	if m.Context() != ctx {
		t.Fatal("the message context must be restored after the delivery")
	}
	upstream.End()
	spans, delivery := k.Named("upstream"), k.deliveries()
	if len(spans) != 1 || len(delivery) != 1 {
		t.Fatalf("%d upstream spans, %d delivery spans; want 1 and 1", len(spans), len(delivery))
	}
	if p := delivery[0].Parent(); p.SpanID() != spans[0].SpanContext().SpanID() || p.TraceID() != spans[0].SpanContext().TraceID() {
		t.Fatalf("delivery span parent %v, want the upstream span %v", p, spans[0].SpanContext())
	}
	attrs := teltest.SpanAttrs(delivery[0])
	if attrs["idempotency.key"].AsString() != "m1" || attrs["idempotency.scope"].AsString() != "test" ||
		attrs["idempotency.decision"].AsString() != "execute" || attrs["idempotency.outcome"].AsString() != "executed" ||
		attrs["idempotency.attempt"].AsInt64() != 1 {
		t.Fatalf("delivery span attributes %v", attrs)
	}
	if up := teltest.SpanAttrs(spans[0]); len(up) != 0 {
		t.Fatalf("upstream span attributes %v, want none of oncemill's", up)
	}
	if names := k.storeSpanNames(delivery[0].SpanContext()); strings.Join(names, ",") != "oncemill.store.begin,oncemill.store.complete" {
		t.Fatalf("store spans %v", names)
	}
}

// In the one-transaction mode the store spans are the claim and the
// commit.
func TestTelemetryOneTransactionSpans(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	st := newFakeTxStore()
	t.Cleanup(func() { _ = st.Close() })
	cfg := idempotency.Config{KeyGenerator: keygen.UUID(), Scope: "s", Policy: txPolicy()}
	k.use(&cfg)
	idem, err := idempotency.NewTransactional(st, cfg)
	if err != nil {
		t.Fatal(err)
	}
	handler := idem.Middleware(telNoop)
	if err := telRun(handler, msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	delivery := k.deliveries()
	if len(delivery) != 1 {
		t.Fatalf("%d delivery spans", len(delivery))
	}
	if names := k.storeSpanNames(delivery[0].SpanContext()); strings.Join(names, ",") != "oncemill.store.claim,oncemill.store.commit" {
		t.Fatalf("store spans %v, want claim then commit", names)
	}
	ms := k.collect(t)
	if got := teltest.HistCounts(t, ms, "oncemill.store.duration", "operation"); !maps.Equal(got, map[string]uint64{"claim": 1, "commit": 1}) {
		t.Fatalf("store.duration counts %v", got)
	}
}

// telFailStore fails the named operations with errTelStoreDown.
type telFailStore struct {
	store.Store
	begin, complete, release bool
}

var errTelStoreDown = errors.New("store connection refused")

func (f telFailStore) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if f.begin {
		return store.ClaimResult{}, errTelStoreDown
	}
	return f.Store.ClaimLease(ctx, req)
}

func (f telFailStore) Complete(ctx context.Context, l store.Claim, o store.Completion) error {
	if f.complete {
		return errTelStoreDown
	}
	return f.Store.Complete(ctx, l, o)
}

func (f telFailStore) Release(ctx context.Context, l store.Claim, out store.Completion) error {
	if f.release {
		return errTelStoreDown
	}
	return f.Store.Release(ctx, l, out)
}

// A failing store call ends its span with status Error, the error's text as
// the description, and an exception event; it is still timed.
func TestTelemetryFailingStoreSpans(t *testing.T) {
	t.Parallel()
	retryable := func(*message.Message) ([]*message.Message, error) { return nil, errors.New("handler: try later") }
	for _, tc := range []struct {
		name        string
		fail        telFailStore
		handler     message.HandlerFunc
		failingSpan string
		wantSpans   string // the store spans under the delivery span
		outcome     string
		deliveryErr bool // nacked: the delivery span is an Error too
	}{
		{"begin", telFailStore{begin: true}, telNoop, "oncemill.store.begin", "oncemill.store.begin", "store_failed", true},
		{"release", telFailStore{release: true}, retryable, "oncemill.store.release", "oncemill.store.begin,oncemill.store.release", "released", true},
		// The success is acked although it could not be recorded; the
		// stage tries Complete again while the lease is held (its finish
		// retry): for a 300 ms lease, less a tenth, the direct try, then
		// retries 50 ms after it and after waits of 50, 100 and 200 ms
		// ±30% (the later ones only as long as the draws fit the 270 ms):
		// 3 to 4 tries in all.
		{"complete", telFailStore{complete: true}, telNoop, "oncemill.store.complete",
			"oncemill.store.begin,oncemill.store.complete,oncemill.store.complete,oncemill.store.complete(,oncemill.store.complete)?", "executed", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			k := newTelKit(t)
			h := newHarness(t, func(c *stageConfig) {
				k.use(&c.Config)
				tc.fail.Store = c.Store
				c.Store = tc.fail
				c.Policy.LeaseDuration, c.Policy.Heartbeat = 300*time.Millisecond, 100*time.Millisecond
			})
			err := telRun(h.stage.Middleware(tc.handler), msg("m1", "x"))
			if (err != nil) != tc.deliveryErr {
				t.Fatalf("delivery error %v, want error %v", err, tc.deliveryErr)
			}
			delivery := k.deliveries()
			if len(delivery) != 1 {
				t.Fatalf("%d delivery spans", len(delivery))
			}
			if names := k.storeSpanNames(delivery[0].SpanContext()); !regexp.MustCompile("^" + tc.wantSpans + "$").MatchString(strings.Join(names, ",")) {
				t.Fatalf("store spans %v, want %s", names, tc.wantSpans)
			}
			for _, s := range k.Spans.Ended() {
				if !strings.HasPrefix(s.Name(), "oncemill.store.") {
					continue
				}
				st := s.Status()
				if s.Name() != tc.failingSpan {
					if st.Code != codes.Unset {
						t.Errorf("%s: status %+v, want unset", s.Name(), st)
					}
					continue
				}
				if st.Code != codes.Error || st.Description != errTelStoreDown.Error() {
					t.Errorf("%s: status %+v, want Error %q", s.Name(), st, errTelStoreDown)
				}
				if ev := s.Events(); len(ev) != 1 || ev[0].Name != "exception" {
					t.Errorf("%s: events %v, want one exception event", s.Name(), ev)
				}
			}
			if got := delivery[0].Status().Code; (got == codes.Error) != tc.deliveryErr {
				t.Errorf("delivery span status %v, want Error %v", delivery[0].Status(), tc.deliveryErr)
			}
			if got := teltest.SpanAttrs(delivery[0])["idempotency.outcome"].AsString(); got != tc.outcome {
				t.Errorf("idempotency.outcome %q, want %q", got, tc.outcome)
			}
			ms := k.collect(t)
			op := strings.TrimPrefix(tc.failingSpan, "oncemill.store.")
			if got := teltest.HistCounts(t, ms, "oncemill.store.duration", "operation")[op]; got == 0 {
				t.Errorf("a failed %s is not timed", op)
			}
			if got := teltest.Sums(t, ms, "oncemill.outcomes", "outcome"); !maps.Equal(got, map[string]int64{tc.outcome: 1}) {
				t.Errorf("outcomes %v", got)
			}
			wantErrors := map[string]int64{op: 1}
			if op == "complete" {
				wantErrors[op] = int64(len(k.Named(tc.failingSpan))) // one per try
			}
			if got := teltest.Sums(t, ms, "oncemill.store.errors", "operation"); !maps.Equal(got, wantErrors) {
				t.Errorf("store errors %v, want %v", got, wantErrors)
			}
			wantDecisions := map[string]int64{"execute": 1}
			if tc.fail.begin {
				wantDecisions = map[string]int64{} // the store never decided
			}
			if got := teltest.Sums(t, ms, "oncemill.decisions", "decision"); !maps.Equal(got, wantDecisions) {
				t.Errorf("decisions %v, want %v", got, wantDecisions)
			}
			if _, ok := teltest.SpanAttrs(delivery[0])["idempotency.decision"]; ok == tc.fail.begin {
				t.Errorf("idempotency.decision present %v, want %v", ok, !tc.fail.begin)
			}
		})
	}
}

// A message without a key, run anyway under policy.MissingKeyRunUnguarded: outcome
// unguarded, no decision, no store span, and no lease (so no handler
// duration either).
func TestTelemetryUnguarded(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) {
		k.use(&c.Config)
		c.KeyGenerator = keygen.Func(func(*message.Message) (string, error) { return "", nil })
		c.Policy.MissingKey = policy.MissingKeyRunUnguarded
	})
	if err := telRun(h.stage.Middleware(telNoop), msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	delivery := k.deliveries()
	if len(delivery) != 1 {
		t.Fatalf("%d delivery spans", len(delivery))
	}
	attrs := teltest.SpanAttrs(delivery[0])
	if attrs["idempotency.outcome"].AsString() != "unguarded" || attrs["idempotency.key"].AsString() != "" {
		t.Errorf("attributes %v", attrs)
	}
	for _, a := range []string{"idempotency.decision", "idempotency.attempt"} {
		if _, ok := attrs[a]; ok {
			t.Errorf("%s set on an unguarded delivery", a)
		}
	}
	if names := k.storeSpanNames(delivery[0].SpanContext()); len(names) != 0 {
		t.Errorf("store spans %v", names)
	}
	ms := k.collect(t)
	if got := teltest.Sums(t, ms, "oncemill.outcomes", "outcome"); !maps.Equal(got, map[string]int64{"unguarded": 1}) {
		t.Errorf("outcomes %v", got)
	}
	if got := teltest.Sums(t, ms, "oncemill.decisions", "decision"); len(got) != 0 {
		t.Errorf("decisions %v, want none", got)
	}
	if got := teltest.HistCounts(t, ms, "oncemill.handler.duration", ""); len(got) != 0 {
		t.Errorf("handler.duration %v, want none", got)
	}
}

// countingTracerProvider counts the spans its tracers start.
type countingTracerProvider struct {
	trace.TracerProvider
	starts *atomic.Int32
}

func (p countingTracerProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return countingTracer{Tracer: p.TracerProvider.Tracer(name, opts...), starts: p.starts}
}

type countingTracer struct {
	trace.Tracer
	starts *atomic.Int32
}

func (t countingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	t.starts.Add(1)
	return t.Tracer.Start(ctx, name, opts...)
}

// Without a recording delivery span (a sampler that drops it), no store
// span is started: the stage starts the delivery span and nothing else.
// The metrics are recorded all the same.
func TestTelemetryNoStoreSpansWithoutARecordingDeliverySpan(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	var starts atomic.Int32
	unsampled := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()), sdktrace.WithSpanProcessor(k.Spans))
	t.Cleanup(func() { _ = unsampled.Shutdown(context.Background()) })
	h := newHarness(t, func(c *stageConfig) {
		k.use(&c.Config)
		c.TracerProvider = countingTracerProvider{TracerProvider: unsampled, starts: &starts}
	})
	if err := telRun(h.stage.Middleware(telNoop), msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	if n := starts.Load(); n != 1 {
		t.Fatalf("%d spans started for one delivery under a sampler that drops it, want 1 (the delivery span)", n)
	}
	if n := len(k.Spans.Ended()); n != 0 {
		t.Fatalf("%d spans recorded, want 0", n)
	}
	ms := k.collect(t)
	if got := teltest.Sums(t, ms, "oncemill.decisions", "decision"); !maps.Equal(got, map[string]int64{"execute": 1}) {
		t.Fatalf("decisions %v", got)
	}
	if got := teltest.HistCounts(t, ms, "oncemill.store.duration", "operation"); !maps.Equal(got, map[string]uint64{"begin": 1, "complete": 1}) {
		t.Fatalf("store.duration counts %v: the store calls are timed without their spans", got)
	}
}

// Every decision value, produced deliberately on one stage, and the other
// per-delivery metrics: outcomes, store and handler durations, live leases.
func TestTelemetryDecisionsAndOutcomes(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) {
		k.use(&c.Config)
		c.Policy.HeldKey = policy.HeldKeyNack
		c.Policy.MaxPayloadBytes = 64
	})
	run := func(handler message.HandlerFunc, m *message.Message) error {
		return telRun(h.stage.Middleware(handler), m)
	}
	declined := func(*message.Message) ([]*message.Message, error) {
		return nil, policy.Cached(errors.New("card declined"))
	}
	down := func(*message.Message) ([]*message.Message, error) { return nil, errors.New("try later") }

	// execute, then replay and mismatch of the same key.
	if err := run(telNoop, msg("m1", "a")); err != nil {
		t.Fatal(err)
	}
	if err := run(telNoop, msg("m1", "a")); err != nil {
		t.Fatal(err)
	}
	if err := run(telNoop, msg("m1", "b")); err != nil {
		t.Fatal(err)
	}
	// execute with a permanent failure, then its cached failure.
	_ = run(declined, msg("m2", "a"))
	_ = run(declined, msg("m2", "a"))
	// takeover: a worker took the lease and died; the lease expires.
	m3 := msg("m3", "a")
	if _, err := h.store.ClaimLease(context.Background(), store.LeaseRequest{Scope: "test", Key: "m3", Fingerprint: keygen.PayloadFingerprint(m3), LeaseDuration: time.Minute}); err != nil {
		t.Fatal(err)
	}
	h.clock.Advance(2 * time.Minute)
	if err := run(telNoop, m3); err != nil {
		t.Fatal(err)
	}
	// held: a duplicate arrives while the first delivery runs; and
	// meanwhile one lease is live.
	started, proceed, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- run(func(*message.Message) ([]*message.Message, error) {
			close(started)
			<-proceed
			return nil, nil
		}, msg("m4", "a"))
	}()
	<-started
	if got := teltest.Sums(t, k.collect(t), "oncemill.leases.live", ""); !maps.Equal(got, map[string]int64{"": 1}) {
		t.Errorf("leases.live while one handler runs: %v, want 1", got)
	}
	if err := run(telNoop, msg("m4", "a")); !errors.Is(err, pipeline.ErrKeyHeld) {
		t.Fatalf("duplicate while in progress: %v", err)
	}
	close(proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// execute with a retryable failure: released.
	_ = run(down, msg("m5", "a"))
	// No decision: the store is never asked about a payload over the limit.
	_ = run(telNoop, msg("m6", strings.Repeat("x", 65)))

	ms := k.collect(t)
	if got, want := teltest.Sums(t, ms, "oncemill.decisions", "decision"), map[string]int64{
		"execute": 4, "takeover": 1, "replay": 1, "cached_failure": 1, "held": 1, "mismatch": 1,
	}; !maps.Equal(got, want) {
		t.Errorf("decisions %v, want %v", got, want)
	}
	if got, want := teltest.Sums(t, ms, "oncemill.outcomes", "outcome"), map[string]int64{
		"executed": 3, "replayed": 1, "rejected": 2, "cached_failure": 1, "cached_failure_replayed": 1, "held_key_nacked": 1, "released": 1,
	}; !maps.Equal(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
	// ClaimLease once per delivery that reached the store (all but m6: 9),
	// Complete for the three successes and the cached failure, Release for
	// the retryable failure.
	if got, want := teltest.HistCounts(t, ms, "oncemill.store.duration", "operation"), map[string]uint64{
		"begin": 9, "complete": 4, "release": 1,
	}; !maps.Equal(got, want) {
		t.Errorf("store.duration counts %v, want %v", got, want)
	}
	// The handler ran once per execute or takeover decision.
	if got := teltest.HistCounts(t, ms, "oncemill.handler.duration", ""); !maps.Equal(got, map[string]uint64{"": 5}) {
		t.Errorf("handler.duration counts %v, want 5 (one per execution)", got)
	}
	if got := teltest.Sums(t, ms, "oncemill.leases.live", ""); !maps.Equal(got, map[string]int64{"": 0}) {
		t.Errorf("leases.live after the handlers finished: %v, want 0", got)
	}
}

// Under policy.HeldKeyReject a duplicate of a running key is decided held
// and ends rejected (acked, dead-lettered as rejected).
func TestTelemetryHeldKeyRejected(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) {
		k.use(&c.Config)
		c.Policy.HeldKey = policy.HeldKeyReject
	})
	started, proceed, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- telRun(h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
			close(started)
			<-proceed
			return nil, nil
		}), msg("m1", "x"))
	}()
	<-started
	if err := telRun(h.stage.Middleware(telNoop), msg("m1", "x")); err != nil {
		t.Fatalf("a rejected duplicate is acked, got %v", err)
	}
	close(proceed)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	delivery := k.deliveries()
	if len(delivery) != 2 {
		t.Fatalf("%d delivery spans, want 2", len(delivery))
	}
	// The duplicate's span ended first: the first delivery waited for it.
	if first := teltest.SpanAttrs(delivery[1]); first["idempotency.outcome"].AsString() != "executed" {
		t.Fatalf("first delivery's attributes %v", first)
	}
	attrs := teltest.SpanAttrs(delivery[0])
	if attrs["idempotency.decision"].AsString() != "held" || attrs["idempotency.outcome"].AsString() != "rejected" {
		t.Fatalf("attributes %v", attrs)
	}
	ms := k.collect(t)
	if got := teltest.Sums(t, ms, "oncemill.decisions", "decision"); !maps.Equal(got, map[string]int64{"execute": 1, "held": 1}) {
		t.Errorf("decisions %v", got)
	}
	if got := teltest.Sums(t, ms, "oncemill.outcomes", "outcome"); !maps.Equal(got, map[string]int64{"executed": 1, "rejected": 1}) {
		t.Errorf("outcomes %v", got)
	}
}

// The metrics' names, kinds and units, as docs/observability.md lists them.
func TestTelemetryInstruments(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	h := newHarness(t, func(c *stageConfig) {
		k.use(&c.Config)
		c.DeadLetterPublisher, c.DeadLetterTopic = ps, "dead"
		c.Validation = func(m *message.Message) error {
			if string(m.Payload) == "bad" {
				return errors.New("bad")
			}
			return nil
		}
		c.Retry = telRetryConfig()
		c.CircuitBreaker = &gobreaker.Settings{}
	})
	var calls atomic.Int32
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			return nil, errors.New("try again")
		}
		return nil, nil
	})
	_ = telRun(handler, msg("m1", "x"))
	_ = telRun(handler, msg("m2", "bad"))
	_ = telRun(handler, msg("m1", "y")) // mismatch: dead-lettered

	ms := k.collect(t)
	for name, want := range map[string]struct {
		unit string
		kind string
	}{
		"oncemill.decisions":          {"{delivery}", "counter"},
		"oncemill.outcomes":           {"{delivery}", "counter"},
		"oncemill.retries":            {"{retry}", "counter"},
		"oncemill.validation.invalid": {"{message}", "counter"},
		"oncemill.dead_letters":       {"{message}", "counter"},
		"oncemill.store.duration":     {"s", "histogram"},
		"oncemill.handler.duration":   {"s", "histogram"},
		"oncemill.leases.live":        {"{lease}", "updowncounter"},
		"oncemill.breaker.state":      {"{state}", "gauge"},
	} {
		m, ok := ms[name]
		if !ok {
			t.Errorf("%s not recorded", name)
			continue
		}
		kind := ""
		switch d := m.Data.(type) {
		case metricdata.Sum[int64]:
			kind = "updowncounter"
			if d.IsMonotonic {
				kind = "counter"
			}
		case metricdata.Histogram[float64]:
			kind = "histogram"
		case metricdata.Gauge[int64]:
			kind = "gauge"
		}
		if m.Unit != want.unit || kind != want.kind || m.Description == "" {
			t.Errorf("%s: unit %q kind %q (%T) description %q; want unit %q kind %q", name, m.Unit, kind, m.Data, m.Description, want.unit, want.kind)
		}
	}
	if len(ms) != 9 {
		t.Errorf("%d metrics, want the 9 listed", len(ms))
	}
}

func telRetryConfig() *pipeline.RetryConfig {
	return &pipeline.RetryConfig{InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, RandomizationFactor: -1}
}

// oncemill.retries counts the retry stage's in-process retries: three tries,
// two failures, two retries; one execution, one lease, one handler duration.
func TestTelemetryRetries(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) {
		k.use(&c.Config)
		c.Retry = telRetryConfig()
		c.Retry.MaxTries = 3
	})
	var calls atomic.Int32
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) <= 2 {
			return nil, errors.New("database briefly unavailable")
		}
		return nil, nil
	})
	if err := telRun(handler, msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	ms := k.collect(t)
	if got := teltest.Sums(t, ms, "oncemill.retries", ""); !maps.Equal(got, map[string]int64{"": 2}) {
		t.Errorf("retries %v, want 2", got)
	}
	if got := teltest.Sums(t, ms, "oncemill.decisions", "decision"); !maps.Equal(got, map[string]int64{"execute": 1}) {
		t.Errorf("decisions %v", got)
	}
	if got := teltest.HistCounts(t, ms, "oncemill.handler.duration", ""); !maps.Equal(got, map[string]uint64{"": 1}) {
		t.Errorf("handler.duration %v, want one execution (retries included)", got)
	}
	if got := teltest.Sums(t, ms, "oncemill.leases.live", ""); !maps.Equal(got, map[string]int64{"": 0}) {
		t.Errorf("leases.live %v", got)
	}
}

// oncemill.breaker.state: 0 when built (closed), 2 once open, 1 while
// half-open, 0 again once closed; attribute breaker=<name>.
func TestTelemetryBreakerState(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	var halfOpen atomic.Int64
	halfOpen.Store(-1)
	h := newHarness(t, func(c *stageConfig) {
		k.use(&c.Config)
		c.CircuitBreaker = &gobreaker.Settings{
			Name: "payments-db",
			// Long enough that the delivery right after the circuit opens
			// finds it still open on a loaded machine (a millisecond was
			// not, under -race), short enough for the probe below.
			Timeout:     500 * time.Millisecond,
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 2 },
			OnStateChange: func(_ string, _, to gobreaker.State) {
				if to == gobreaker.StateHalfOpen {
					// The gauge is recorded before this callback runs.
					halfOpen.Store(teltest.Gauge[int64](t, k.collect(t), "oncemill.breaker.state", "breaker")["payments-db"])
				}
			},
		}
	})
	state := func() map[string]int64 {
		return teltest.Gauge[int64](t, k.collect(t), "oncemill.breaker.state", "breaker")
	}
	if got := state(); !maps.Equal(got, map[string]int64{"payments-db": 0}) {
		t.Fatalf("after NewLeased: %v, want closed (0)", got)
	}
	var fail atomic.Bool
	fail.Store(true)
	handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		if fail.Load() {
			return nil, errors.New("connection refused")
		}
		return nil, nil
	})
	_ = telRun(handler, msg("m1", "x"))
	_ = telRun(handler, msg("m2", "x"))
	if got := state(); !maps.Equal(got, map[string]int64{"payments-db": 2}) {
		t.Fatalf("after two failures: %v, want open (2)", got)
	}
	if err := telRun(handler, msg("m3", "x")); !errors.Is(err, pipeline.ErrCircuitOpen) {
		t.Fatalf("a delivery at once after opening: %v, want ErrCircuitOpen", err)
	}
	fail.Store(false)
	probe := 0
	testenv.WaitFor(t, 10*time.Second, "a probe through the half-open breaker to succeed", func() bool {
		probe++
		return telRun(handler, msg(fmt.Sprint("probe", probe), "x")) == nil
	})
	if got := state(); !maps.Equal(got, map[string]int64{"payments-db": 0}) {
		t.Fatalf("after closing: %v, want closed (0)", got)
	}
	if halfOpen.Load() != 1 {
		t.Fatalf("while half-open the gauge read %d, want 1", halfOpen.Load())
	}
}

// oncemill.validation.invalid and oncemill.dead_letters{reason}, with the
// dead letters read back from the gochannel topic they were forwarded to.
func TestTelemetryValidationAndDeadLetters(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	ps := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = ps.Close() })
	dead, err := ps.Subscribe(context.Background(), "dead")
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, func(c *stageConfig) {
		k.use(&c.Config)
		c.DeadLetterPublisher, c.DeadLetterTopic = ps, "dead"
		c.Policy.MaxPayloadBytes = 64
		c.Validation = func(m *message.Message) error {
			if string(m.Payload) == "bad" {
				return errors.New("amount missing")
			}
			return nil
		}
	})
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if string(m.Payload) == "declined" {
			return nil, policy.Cached(errors.New("card declined"))
		}
		return nil, nil
	})
	for _, m := range []*message.Message{
		msg("m1", "bad"),                    // invalid
		msg("m2", "a"),                      // executed
		msg("m2", "b"),                      // mismatch
		msg("m3", "declined"),               // cached failure
		msg("m3", "declined"),               // its replay: not forwarded again
		msg("m4", strings.Repeat("x", 100)), // payload too large
	} {
		if err := telRun(handler, m); err != nil {
			t.Fatalf("%s: %v", m.UUID, err)
		}
	}
	got := map[string]string{}
	for range 4 {
		select {
		case m := <-dead:
			got[m.Metadata.Get(pipeline.ReasonKindKey)] = m.UUID
			m.Ack()
		case <-time.After(10 * time.Second):
			t.Fatalf("dead letters received: %v, want 4", got)
		}
	}
	if want := map[string]string{"invalid": "m1", "mismatch": "m2", "cached_failure": "m3", "payload_too_large": "m4"}; !maps.Equal(got, want) {
		t.Fatalf("dead letters by reason %v, want %v", got, want)
	}
	ms := k.collect(t)
	if got := teltest.Sums(t, ms, "oncemill.validation.invalid", ""); !maps.Equal(got, map[string]int64{"": 1}) {
		t.Errorf("validation.invalid %v, want 1", got)
	}
	deadLetters := teltest.Sums(t, ms, "oncemill.dead_letters", "reason")
	if got, want := map[string]int64{
		"mismatch": deadLetters["mismatch"], "cached_failure": deadLetters["cached_failure"], "payload_too_large": deadLetters["payload_too_large"],
	}, map[string]int64{"mismatch": 1, "cached_failure": 1, "payload_too_large": 1}; !maps.Equal(got, want) {
		t.Errorf("dead_letters %v, want %v", deadLetters, want)
	}
	if deadLetters["invalid"] != 1 {
		t.Errorf("dead_letters{reason=invalid} = %d, want 1", deadLetters["invalid"])
	}
	// The invalid message never reached the store: no decision for it, and
	// the outcome "invalid".
	if got, want := teltest.Sums(t, ms, "oncemill.outcomes", "outcome"), map[string]int64{
		"executed": 1, "rejected": 2, "cached_failure": 1, "cached_failure_replayed": 1, "invalid": 1,
	}; !maps.Equal(got, want) {
		t.Errorf("outcomes %v, want %v", got, want)
	}
	if got, want := teltest.Sums(t, ms, "oncemill.decisions", "decision"), map[string]int64{
		"execute": 2, "mismatch": 1, "cached_failure": 1,
	}; !maps.Equal(got, want) {
		t.Errorf("decisions %v, want %v", got, want)
	}
}

// telRaceEnabled reports whether the test binary was built with -race, from
// its build settings (the race detector changes allocation counts).
func telRaceEnabled() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range bi.Settings {
		if s.Key == "-race" {
			return s.Value == "true"
		}
	}
	return false
}

// Allocations per delivery, pinned at what they are now (measured with
// Go 1.26, Watermill v1.5.3 and otel v1.47.0 over the memory store).
const (
	// The stage without an SDK: the default global providers (no delivery
	// span is started while they are idle), and an SDK's meter provider
	// with them.
	telReplayAllocs  = 2
	telExecuteAllocs = 5
	// The same with explicit no-op providers, or an SDK's meter provider
	// and a no-op tracer provider: the delivery span is started, and the
	// API's non-recording span and the contexts carrying it are allocated.
	telSpanReplayAllocs  = 5
	telSpanExecuteAllocs = 8
)

// Without an SDK, telemetry costs the stage nothing: the default global
// providers hand out no-op instruments and non-recording spans, the
// attribute sets are prebuilt, no clock is read and no child span is
// started. Every message passes through the stage, so this guards that
// design: a change that makes telemetry allocate without an SDK (an
// attribute built per message, a span started regardless) raises these
// numbers and fails here. An SDK's metrics add nothing per message either
// (prebuilt attribute sets).
func TestTelemetryAllocatesNothingWithoutAnSDK(t *testing.T) {
	if telRaceEnabled() {
		t.Skip("the race detector changes allocation counts")
	}
	sdkMetrics := newTelKit(t).MeterProvider
	for _, tc := range []struct {
		name                  string
		tp                    trace.TracerProvider
		mp                    metric.MeterProvider
		maxReplay, maxExecute float64
		more                  func(*stageConfig) // nil: nothing more
	}{
		{"global providers", nil, nil, telReplayAllocs, telExecuteAllocs, nil}, // nil: the globals
		{"SDK metrics, global tracer provider", nil, sdkMetrics, telReplayAllocs, telExecuteAllocs, nil},
		{"noop providers", tracenoop.NewTracerProvider(), metricnoop.NewMeterProvider(), telSpanReplayAllocs, telSpanExecuteAllocs, nil},
		{"SDK metrics, noop tracer provider", tracenoop.NewTracerProvider(), sdkMetrics, telSpanReplayAllocs, telSpanExecuteAllocs, nil},
		// A scope function, a retention override looked up by handler name,
		// and a logger above debug level (the progress lines off) add nothing.
		{"global providers, scope function, retention overrides, info logger", nil, nil, telReplayAllocs, telExecuteAllocs, func(c *stageConfig) {
			c.Scope, c.ScopeFunc = "", func(*message.Message) (string, error) { return "tenant", nil }
			c.RetentionFor = map[string]idempotency.Retention{"other": {SuccessTTL: time.Hour}}
			c.Logger = slog.New(slog.NewTextHandler(io.Discard, &slog.HandlerOptions{Level: slog.LevelInfo}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, func(c *stageConfig) {
				c.TracerProvider, c.MeterProvider, c.EventHandler = tc.tp, tc.mp, nil
				if tc.more != nil {
					tc.more(c)
				}
			})
			handler := h.stage.Middleware(telNoop)

			dup := msg("m0", "x")
			if err := telRun(handler, dup); err != nil {
				t.Fatal(err)
			}
			replay := testing.AllocsPerRun(200, func() { _ = telRun(handler, dup) })

			const runs = 200
			msgs := make([]*message.Message, runs+1) // AllocsPerRun makes one warm-up call
			for i := range msgs {
				msgs[i] = msg(fmt.Sprintf("e%04d", i), "x")
			}
			next := 0
			execute := testing.AllocsPerRun(runs, func() { _ = telRun(handler, msgs[next]); next++ })
			t.Logf("allocs per delivery: replay %.0f, execute %.0f", replay, execute)
			if replay > tc.maxReplay {
				t.Errorf("replay allocates %.0f per delivery, pinned at %.0f", replay, tc.maxReplay)
			}
			if execute > tc.maxExecute {
				t.Errorf("execute allocates %.0f per delivery, pinned at %.0f", execute, tc.maxExecute)
			}
		})
	}
}

// oncemill.attempts.exhausted counts each delivery that failed retryably on
// its last attempt or later, by what became of it.
func TestTelemetryAttemptsExhausted(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	dead := gochannel.NewGoChannel(gochannel.Config{Persistent: true}, watermill.NopLogger{})
	t.Cleanup(func() { _ = dead.Close() })
	failing := func(*message.Message) ([]*message.Message, error) { return nil, errors.New("down") }
	for _, mutate := range []func(*stageConfig){
		func(c *stageConfig) {}, // kept: two deliveries past the cap
		func(c *stageConfig) { c.Policy.Exhausted = policy.ExhaustedDrop },
		func(c *stageConfig) { c.DeadLetterPublisher, c.DeadLetterTopic = dead, "dead" },
	} {
		h := newHarness(t, func(c *stageConfig) {
			k.use(&c.Config)
			c.Policy.MaxAttempts = 1
			mutate(c)
		})
		for range 2 {
			_, _ = h.stage.Middleware(failing)(msg("m1", "x"))
		}
	}
	// Kept twice; dropped and dead-lettered once each (the second delivery
	// replays the cached failure).
	if got := teltest.Sums(t, k.collect(t), "oncemill.attempts.exhausted", "action"); !maps.Equal(got, map[string]int64{"kept": 2, "dropped": 1, "dead_lettered": 1}) {
		t.Errorf("attempts.exhausted %v", got)
	}
}
