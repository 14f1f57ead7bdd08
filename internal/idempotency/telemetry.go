package idempotency

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/store"
)

// instrumentationName names oncemill's tracer and meter.
const instrumentationName = "github.com/oncemill/oncemill"

// Span attribute keys oncemill sets besides the messaging conventions.
const (
	attrKey      = attribute.Key("idempotency.key")
	attrScope    = attribute.Key("idempotency.scope")
	attrDecision = attribute.Key("idempotency.decision")
	attrAttempt  = attribute.Key("idempotency.attempt")
	attrOutcome  = attribute.Key("idempotency.outcome")
	attrTTL      = attribute.Key("idempotency.ttl_seconds")
	attrShadow   = attribute.Key("idempotency.shadow")
	// maxAttrKeyLen: longer keys are replaced by their SHA-256 in spans.
	maxAttrKeyLen = 128
)

// telemetry records oncemill's spans and metrics. The zero cost when no SDK
// is installed matters: every message passes through it, so attribute sets
// are built once, clocks are read only when a histogram is enabled, and child
// spans are started only under a recording delivery span.
type telemetry struct {
	tracer trace.Tracer
	system attribute.KeyValue

	// idleTP and idleMP are the global providers the telemetry came from
	// while no SDK is installed behind them (nil when the application
	// passed its own). As long as otel.GetTracerProvider() and
	// GetMeterProvider() still return them, spans and measurements would
	// record nothing, and the hot path skips them: the check is an atomic
	// load and a comparison, where starting a span costs ~200 ns, 3
	// allocations, and deep calls that grow the router goroutine's stack.
	// Once an SDK is installed, the globals are other values, and the
	// instruments made from the old ones delegate to it.
	idleTP trace.TracerProvider
	idleMP metric.MeterProvider

	decisions, outcomes, retries, invalids, deadLetters metric.Int64Counter
	storeErrors, exhaustions, shadows                   metric.Int64Counter
	storeDuration, handlerDuration, replayAge           metric.Float64Histogram
	liveLeases                                          metric.Int64UpDownCounter
	breaker                                             metric.Int64Gauge

	// Option slices built once: passing a prebuilt slice to a variadic
	// Add or Record allocates nothing per message. byHandler holds them
	// per Watermill handler name: a map under a lock, whose string lookup
	// allocates nothing, where a sync.Map would box the name.
	mu            sync.RWMutex
	byHandler     map[string]*handlerAttrs
	storeAttrs    [storeOps][]metric.RecordOption
	storeErrAttrs [storeOps][]metric.AddOption
	replayAttrs   map[store.Status][]metric.RecordOption
	exhaustAttrs  map[exhaustedAction][]metric.AddOption
}

// handlerAttrs are the options of one Watermill handler's decisions,
// outcomes and handler durations: each carries the handler attribute, so
// that a worker with many handlers shows each one's replay rate.
type handlerAttrs struct {
	decisions map[string][]metric.AddOption
	outcomes  map[pipeline.Outcome][]metric.AddOption
	duration  []metric.RecordOption
}

// attrsOf returns the options of the handler that ctx's message is
// delivered to (message.HandlerNameFromCtx; "" outside a router), built on
// its first delivery.
func (t *telemetry) attrsOf(ctx context.Context) *handlerAttrs {
	name := message.HandlerNameFromCtx(ctx)
	t.mu.RLock()
	a, ok := t.byHandler[name]
	t.mu.RUnlock()
	if ok {
		return a
	}
	handler := attribute.String("handler", name)
	set := func(k, v string) attribute.Set { return attribute.NewSet(handler, attribute.String(k, v)) }
	a = &handlerAttrs{
		decisions: map[string][]metric.AddOption{},
		outcomes:  map[pipeline.Outcome][]metric.AddOption{},
		duration:  []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(handler))},
	}
	for _, d := range decisionNames {
		a.decisions[d] = []metric.AddOption{metric.WithAttributeSet(set("decision", d))}
	}
	for o := pipeline.OutcomeExecuted; o <= pipeline.OutcomeKeyFailed; o++ {
		a.outcomes[o] = []metric.AddOption{metric.WithAttributeSet(set("outcome", o.String()))}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if got, ok := t.byHandler[name]; ok {
		return got
	}
	t.byHandler[name] = a
	return a
}

// exhaustedAction is what became of a message whose attempts ran out: the
// action attribute of oncemill.attempts.exhausted.
type exhaustedAction string

const (
	exhaustedDeadLettered exhaustedAction = "dead_lettered"
	exhaustedDropped      exhaustedAction = "dropped"
	exhaustedKept         exhaustedAction = "kept"
)

// Store operations measured by oncemill.store.duration.
type storeOp int

const (
	opBegin storeOp = iota
	opComplete
	opRelease
	opExtend
	opClaim
	opCommit
	opRecordRollback
	storeOps
)

var storeOpNames = [storeOps]string{"begin", "complete", "release", "extend", "claim", "commit", "record_rollback"}

// secondBuckets suit durations in seconds from half a millisecond (a memory
// or nearby store) to ten seconds (a slow handler); the SDK's default
// boundaries assume milliseconds.
var secondBuckets = metric.WithExplicitBucketBoundaries(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

// ageBuckets span a replayed outcome's age: a concurrent duplicate (under a
// second), a redelivery (seconds to minutes), a re-publish (hours, days).
var ageBuckets = metric.WithExplicitBucketBoundaries(0.1, 1, 10, 60, 600, 3600, 6*3600, 24*3600, 7*24*3600)

// Span start options, built once: inline options allocate on every span.
var (
	consumerSpan = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	clientSpan   = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindClient)}
)

// decisionNames are the values of the decision attribute.
var decisionNames = []string{"execute", "takeover", "replay", "cached_failure", "held", "mismatch"}

// newTelemetry creates the instruments over the providers (nil: the
// global ones) for the messaging.system attribute ("kafka", "rabbitmq",
// "aws_sqs", ...; empty: "watermill"). oncemill uses the API only; the
// application installs the SDK and exporters.
func newTelemetry(tp trace.TracerProvider, mp metric.MeterProvider, system string) (*telemetry, error) {
	var idleTP trace.TracerProvider
	var idleMP metric.MeterProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
		if isGlobalDelegate(tp) {
			idleTP = tp
		}
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
		if isGlobalDelegate(mp) {
			idleMP = mp
		}
	}
	if system == "" {
		system = "watermill"
	}
	m := mp.Meter(instrumentationName)
	t := &telemetry{
		tracer:    tp.Tracer(instrumentationName),
		system:    semconv.MessagingSystemKey.String(system),
		idleTP:    idleTP,
		idleMP:    idleMP,
		byHandler: map[string]*handlerAttrs{},
	}
	var errs [13]error
	t.decisions, errs[0] = m.Int64Counter("oncemill.decisions", metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries by the idempotency decision: execute, takeover, replay, cached_failure, held, mismatch."))
	t.outcomes, errs[1] = m.Int64Counter("oncemill.outcomes", metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries by what the idempotency stage did, acked or nacked."))
	t.retries, errs[2] = m.Int64Counter("oncemill.retries", metric.WithUnit("{retry}"),
		metric.WithDescription("In-process retries of a handler by the retry stage."))
	t.invalids, errs[3] = m.Int64Counter("oncemill.validation.invalid", metric.WithUnit("{message}"),
		metric.WithDescription("Messages refused by the validation stage and acked."))
	t.deadLetters, errs[4] = m.Int64Counter("oncemill.dead_letters", metric.WithUnit("{message}"),
		metric.WithDescription("Messages forwarded to the dead-letter topic, by reason."))
	t.storeDuration, errs[5] = m.Float64Histogram("oncemill.store.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of store operations, by operation."), secondBuckets)
	t.handlerDuration, errs[6] = m.Float64Histogram("oncemill.handler.duration", metric.WithUnit("s"),
		metric.WithDescription("Duration of the wrapped handler (retries, breaker and transaction included) per execution."), secondBuckets)
	t.liveLeases, errs[7] = m.Int64UpDownCounter("oncemill.leases.live", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases held by handlers running now in this process."))
	t.replayAge, errs[10] = m.Float64Histogram("oncemill.replay.age", metric.WithUnit("s"),
		metric.WithDescription("Age of the outcome a duplicate was answered with, by original outcome: succeeded or failed."), ageBuckets)
	t.storeErrors, errs[9] = m.Int64Counter("oncemill.store.errors", metric.WithUnit("{call}"),
		metric.WithDescription("Store calls that failed (a lost lease is an answer, not counted), by operation."))
	t.exhaustions, errs[11] = m.Int64Counter("oncemill.attempts.exhausted", metric.WithUnit("{delivery}"),
		metric.WithDescription("Deliveries whose handler failed retryably on the last attempt (policy.MaxAttempts) or past it, by action: dead_lettered, dropped (acked without a dead letter), kept (nacked)."))
	t.shadows, errs[12] = m.Int64Counter("oncemill.shadow.duplicates", metric.WithUnit("{delivery}"),
		metric.WithDescription("Duplicates shadow mode ran the handler for, where enforcement would not have run it, by decision: replay, cached_failure, held, mismatch."))
	t.breaker, errs[8] = m.Int64Gauge("oncemill.breaker.state", metric.WithUnit("{state}"),
		metric.WithDescription("Circuit breaker state: 0 closed, 1 half-open, 2 open."))
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("oncemill: creating instruments: %w", err)
		}
	}
	set := func(k, v string) metric.MeasurementOption {
		return metric.WithAttributeSet(attribute.NewSet(attribute.String(k, v)))
	}
	for op, name := range storeOpNames {
		t.storeAttrs[op] = []metric.RecordOption{set("operation", name)}
		t.storeErrAttrs[op] = []metric.AddOption{set("operation", name)}
	}
	t.replayAttrs = map[store.Status][]metric.RecordOption{
		store.StatusSucceeded:     {set("original", store.StatusSucceeded.String())},
		store.StatusCachedFailure: {set("original", store.StatusCachedFailure.String())},
	}
	t.exhaustAttrs = map[exhaustedAction][]metric.AddOption{}
	for _, a := range []exhaustedAction{exhaustedDeadLettered, exhaustedDropped, exhaustedKept} {
		t.exhaustAttrs[a] = []metric.AddOption{set("action", string(a))}
	}
	return t, nil
}

// isGlobalDelegate reports whether p is OpenTelemetry's own global provider,
// the one that delegates to an SDK once one is installed: before that, it
// records nothing.
func isGlobalDelegate(p any) bool {
	t := reflect.TypeOf(p)
	return t.Kind() == reflect.Pointer && t.Elem().PkgPath() == "go.opentelemetry.io/otel/internal/global"
}

// tracing and metering report whether spans and measurements can record
// anything: an SDK is installed, or the application passed its providers.
func (t *telemetry) tracing() bool  { return t.idleTP == nil || otel.GetTracerProvider() != t.idleTP }
func (t *telemetry) metering() bool { return t.idleMP == nil || otel.GetMeterProvider() != t.idleMP }

// Middleware starts one consumer span per delivery, following the OTel
// messaging conventions, and puts it in the message context for the stages.
// The span ends however the chain returns, a panic included.
func (t *telemetry) wrap(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		growStack(0) // the router goroutine's stack grows here, not deep in the store call (stack.go)
		if !t.tracing() {
			return h(msg)
		}
		return t.traced(h, msg)
	}
}

// traced runs h under the delivery span. It is a frame of its own, so that
// the untraced path's frame stays small: every message runs on a fresh
// router goroutine, whose stack grows (and is copied) with every frame.
//
//go:noinline
func (t *telemetry) traced(h message.HandlerFunc, msg *message.Message) ([]*message.Message, error) {
	orig := msg.Context()
	ctx, span := t.tracer.Start(orig, "process", consumerSpan...)
	defer span.End()
	if span.IsRecording() {
		span.SetAttributes(t.system,
			semconv.MessagingMessageID(msg.UUID),
			semconv.MessagingOperationName("process"),
			semconv.MessagingOperationTypeProcess)
		if topic := message.SubscribeTopicFromCtx(orig); topic != "" {
			span.SetName("process " + topic)
			span.SetAttributes(semconv.MessagingDestinationName(topic))
		}
	}
	msg.SetContext(ctx)
	defer msg.SetContext(orig)
	out, err := h(msg)
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	return out, err
}

// decided records what the idempotency stage did with one delivery, and the
// TTL of the outcome it recorded (0: none).
func (t *telemetry) decided(ctx context.Context, e *pipeline.Event, stored time.Duration) {
	if !t.metering() {
		return // no span either: the delivery span is made only under an SDK
	}
	a := t.attrsOf(ctx)
	if d := decisionName(e); d != "" {
		t.decisions.Add(ctx, 1, a.decisions[d]...)
	}
	t.outcomes.Add(ctx, 1, a.outcomes[e.Outcome]...)
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(
		attrKey.String(keygen.StorableKey(e.Key, maxAttrKeyLen)),
		attrScope.String(e.Scope),
		attrOutcome.String(e.Outcome.String()),
	)
	if d := decisionName(e); d != "" {
		span.SetAttributes(attrDecision.String(d))
	}
	if e.Attempt > 0 {
		span.SetAttributes(attrAttempt.Int(e.Attempt))
	}
	if stored > 0 {
		span.SetAttributes(attrTTL.Float64(stored.Seconds()))
	}
	if e.Shadow {
		span.SetAttributes(attrShadow.Bool(true))
	}
}

// shadowed counts a duplicate that shadow mode ran the handler for.
func (t *telemetry) shadowed(ctx context.Context, e *pipeline.Event) {
	if t.metering() {
		t.shadows.Add(ctx, 1, t.attrsOf(ctx).decisions[decisionName(e)]...)
	}
}

// decisionName maps an event to the decision attribute; "" when the store
// was never asked (no key, payload too large).
func decisionName(e *pipeline.Event) string {
	switch e.Decision {
	case store.DecisionExecute:
		if e.Takeover {
			return "takeover"
		}
		return "execute"
	case store.DecisionReplay:
		if e.Outcome == pipeline.OutcomeCachedFailureReplayed {
			return "cached_failure"
		}
		return "replay"
	case store.DecisionHeld:
		return "held"
	case store.DecisionMismatch:
		return "mismatch"
	}
	return ""
}

// measure times one store operation, with a child span under a recording
// delivery span.
type measure struct {
	t     *telemetry
	op    storeOp
	start time.Time
	span  trace.Span
}

func (t *telemetry) startStore(ctx context.Context, op storeOp) (context.Context, measure) {
	m := measure{t: t, op: op}
	if !t.metering() {
		return ctx, m
	}
	if t.storeDuration.Enabled(ctx) {
		m.start = time.Now()
	}
	if trace.SpanFromContext(ctx).IsRecording() {
		ctx, m.span = t.tracer.Start(ctx, "oncemill.store."+storeOpNames[op], clientSpan...)
	}
	return ctx, m
}

// end records the operation. Not inlined: its span and histogram calls would
// enlarge the frame of every store call, which is on the deepest stack path.
//
//go:noinline
func (m measure) end(ctx context.Context, err error) {
	if !m.start.IsZero() {
		m.t.storeDuration.Record(ctx, time.Since(m.start).Seconds(), m.t.storeAttrs[m.op]...)
	}
	if err != nil && !errors.Is(err, store.ErrLeaseLost) && m.t.metering() {
		m.t.storeErrors.Add(ctx, 1, m.t.storeErrAttrs[m.op]...)
	}
	if m.span != nil {
		if err != nil {
			m.span.RecordError(err)
			m.span.SetStatus(codes.Error, err.Error())
		}
		m.span.End()
	}
}

// leaseTaken and leaseDone keep oncemill.leases.live, and time the handler.
// A lease counted is uncounted even if an SDK came in between.
type handlerRun struct {
	start   time.Time
	counted bool
}

func (t *telemetry) leaseTaken(ctx context.Context) handlerRun {
	if !t.metering() {
		return handlerRun{}
	}
	t.liveLeases.Add(ctx, 1)
	r := handlerRun{counted: true}
	if t.handlerDuration.Enabled(ctx) {
		r.start = time.Now()
	}
	return r
}

func (t *telemetry) leaseDone(ctx context.Context, r handlerRun) {
	if !r.counted {
		return
	}
	t.liveLeases.Add(ctx, -1)
	if !r.start.IsZero() {
		t.handlerDuration.Record(ctx, time.Since(r.start).Seconds(), t.attrsOf(ctx).duration...)
	}
}

// replayed records the age of the outcome a duplicate got.
func (t *telemetry) replayed(ctx context.Context, rec *store.Record) {
	if t.metering() && t.replayAge.Enabled(ctx) {
		t.replayAge.Record(ctx, time.Since(rec.UpdatedAt).Seconds(), t.replayAttrs[rec.Status]...)
	}
}

func (t *telemetry) retried(ctx context.Context) { t.retries.Add(ctx, 1) }
func (t *telemetry) invalid(ctx context.Context) {
	if !t.metering() {
		return
	}
	t.invalids.Add(ctx, 1)
	t.outcomes.Add(ctx, 1, t.attrsOf(ctx).outcomes[pipeline.OutcomeInvalid]...)
}

func (t *telemetry) exhausted(ctx context.Context, a exhaustedAction) {
	t.exhaustions.Add(ctx, 1, t.exhaustAttrs[a]...)
}

// deadLettered counts a forwarded message by its reason. Dead letters are
// rare: the attribute is made per call, and no list of the reasons is kept
// here to fall out of step with pipeline's.
func (t *telemetry) deadLettered(ctx context.Context, reason pipeline.DeadLetterReason) {
	t.deadLetters.Add(ctx, 1, metric.WithAttributes(attribute.String("reason", string(reason))))
}

func (t *telemetry) breakerState(name string, s gobreaker.State) {
	v := map[gobreaker.State]int64{gobreaker.StateClosed: 0, gobreaker.StateHalfOpen: 1, gobreaker.StateOpen: 2}[s]
	t.breaker.Record(context.Background(), v, metric.WithAttributes(attribute.String("breaker", name)))
}
