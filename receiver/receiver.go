package receiver

import (
	"cmp"
	"errors"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// Builder collects the receiver's configuration: each With method sets one
// setting and returns the builder; Build validates everything at once, and
// every error names the method that set the value.
type Builder struct {
	ctor string // "New" or "NewTransactional"
	st   store.Store
	ts   store.Transactional
	cfg  idempotency.Config
	errs []error
}

// New starts a builder in the lease mode over st, with the defaults: the
// message UUID as the key, the handler name as the scope, and the zero
// policy.Policy (its defaults). The lease mode claims a key with a
// statement of its own, keeps the lease alive with a heartbeat while the
// handler runs, and records the outcome after it: for records kept apart
// from the business data (memory, Redis, another database).
func New(st store.Store) *Builder {
	return &Builder{ctor: "New", st: st}
}

// NewTransactional starts a builder in the one-transaction mode over ts
// (store/postgres, store/tiered), with the defaults of New. The key is
// claimed by the first statement of the handler's own transaction, which
// the handler finds in its context (postgres.TxFromContext), and the
// success commits with the handler's writes or not at all. A concurrent
// duplicate waits for that transaction, up to the policy's HeldKeyTimeout.
// There is no lease: Build refuses the policy's LeaseDuration and Heartbeat.
func NewTransactional(ts store.Transactional) *Builder {
	return &Builder{ctor: "NewTransactional", ts: ts}
}

func (b *Builder) invalid(setting, format string, args ...any) *Builder {
	b.errs = append(b.errs, configerr.New(setting, format, args...))
	return b
}

// WithKeyGenerator sets who a message is (default keygen.UUID()).
func (b *Builder) WithKeyGenerator(g keygen.Generator) *Builder {
	if g == nil {
		return b.invalid("WithKeyGenerator", "nil; pass a generator such as keygen.UUID()")
	}
	b.cfg.KeyGenerator = g
	return b
}

// WithFingerprint sets how the payload is fingerprinted for mismatch
// detection (default: the generator's own, else keygen.PayloadFingerprint, the
// XXH64 of the payload).
func (b *Builder) WithFingerprint(f func(*message.Message) string) *Builder {
	if f == nil {
		return b.invalid("WithFingerprint", "nil; pass keygen.NoFingerprint to turn mismatch detection off")
	}
	b.cfg.Fingerprint = f
	return b
}

// WithScope sets the key space (default: the Watermill handler name).
// Use it to share records across handlers, or to separate the receivers of
// two tenants; WithScopeFunc separates tenants within one receiver.
func (b *Builder) WithScope(scope string) *Builder {
	if scope == "" {
		return b.invalid("WithScope", "empty; leave it unset to scope by handler name, or pass a name")
	}
	b.cfg.Scope = scope
	return b
}

// WithScopeFunc computes the key space of each message, so that one
// receiver serves many tenants whose keys may collide: a message's record is
// its (scope, key), and the same key of two tenants runs once for each. Use
// it instead of WithScope, not with it. A scope no store can hold is
// hashed, as a key is (keygen.StorableKey). An error is treated as a key
// generator's: one wrapping keygen.ErrNoKey, and an empty scope, as the
// policy's MissingKey says (rejected by default); one the policy caches
// rejects the message; any other nacks it after the policy's NackDelay.
func (b *Builder) WithScopeFunc(scope func(*message.Message) (string, error)) *Builder {
	if scope == nil {
		return b.invalid("WithScopeFunc", "nil; pass a func(*message.Message) (string, error), or leave it unset to scope by handler name")
	}
	b.cfg.ScopeFunc = scope
	return b
}

// WithRetentionFor keeps the outcomes of the Watermill handler named
// handler (router.AddHandler's first argument) for successTTL and
// failureTTL instead of the policy's SuccessTTL and FailureTTL; zero means
// the policy's. One receiver on a router then keeps, say, payments for a
// week and notifications for an hour. Call it once per handler.
func (b *Builder) WithRetentionFor(handler string, successTTL, failureTTL time.Duration) *Builder {
	if _, dup := b.cfg.RetentionFor[handler]; dup {
		return b.invalid("WithRetentionFor", "handler %q is given twice; call it once per handler", handler)
	}
	if b.cfg.RetentionFor == nil {
		b.cfg.RetentionFor = map[string]idempotency.Retention{}
	}
	b.cfg.RetentionFor[handler] = idempotency.Retention{SuccessTTL: successTTL, FailureTTL: failureTTL}
	return b
}

// WithPolicy sets the policy: TTLs, the lease, attempts, what a duplicate
// does while its key is held, and how errors are classified. Its zero fields
// mean their defaults (policy.Policy), so a literal names only what it
// changes: WithPolicy(policy.Policy{SuccessTTL: 7 * 24 * time.Hour}).
func (b *Builder) WithPolicy(p policy.Policy) *Builder {
	b.cfg.Policy = p
	return b
}

// WithLogger sets the logger, the same *slog.Logger the stores take. Nil,
// or no WithLogger at all, means slog.Default(): a rejected or dropped
// message, a dead letter that could not be forwarded and a store that could
// not decide a delivery are logged at error level either way, never silent.
//
// At debug level it also logs each delivery's progress: before the handler
// runs, once its outcome is stored, and each replay with its scope, key,
// original outcome (succeeded or cached_failure) and age. A replay rate
// that never falls, or ages far beyond the broker's redelivery horizon,
// point to a key that does not identify what it should (docs/operations.md).
// Above debug level these lines cost one Enabled call each.
func (b *Builder) WithLogger(l *slog.Logger) *Builder {
	b.cfg.Logger = l
	return b
}

// WithValidation adds validation, first of all: a message for which
// validate returns an error is never stored and never retried; it is acked,
// counted, and dead-lettered if WithDeadLetter is set.
func (b *Builder) WithValidation(validate func(*message.Message) error) *Builder {
	if validate == nil {
		return b.invalid("WithValidation", "nil; pass a func(*message.Message) error")
	}
	b.cfg.Validation = validate
	return b
}

// WithRetry adds in-process retries of what the policy classifies as
// retryable, inside the claim: in the lease mode under the same lease, in
// the one-transaction mode each in a fresh transaction. Zero fields of cfg
// mean their defaults: pipeline.RetryConfig{} is 3 tries.
func (b *Builder) WithRetry(cfg pipeline.RetryConfig) *Builder {
	b.cfg.Retry = &cfg
	return b
}

// WithCircuitBreaker runs each attempt through a sony/gobreaker/v2 circuit
// breaker with these settings, whose zero fields mean gobreaker's defaults.
// Left nil, IsSuccessful counts what the policy caches as a success (a
// business rule said no: the dependency answered), so only retryable
// failures trip the circuit. An open circuit returns
// pipeline.ErrCircuitOpen, which is retryable, and spends no attempt: the
// delivery is nacked after the time the circuit stays open (at least
// NackDelay, at most a minute; pipeline.OutcomeHeldBack). A duplicate with
// a stored outcome is still answered from the record.
func (b *Builder) WithCircuitBreaker(st gobreaker.Settings) *Builder {
	b.cfg.CircuitBreaker = &st
	return b
}

// WithDeadLetter forwards every message that will never be processed to
// topic on pub, once, before acking it, with why in its metadata: the
// reason (pipeline.ReasonKindKey), the attempt that failed
// (pipeline.AttemptKey, 0 if the handler did not run), and the last error
// and where the message came from under Watermill's PoisonQueue keys. The
// reasons (pipeline.DeadLetterReason; docs/reference.md):
//   - invalid: WithValidation refused it;
//   - cached_failure: the handler failed with an error the policy caches;
//   - attempts_exhausted: the handler failed retryably on its last attempt
//     (policy.MaxAttempts; never under policy.NeverCacheFailures);
//   - mismatch: its key is stored with another payload;
//   - duplicate_rejected: a duplicate under policy.HeldKeyReject or
//     policy.FinishedKeyReject;
//   - no_key: it has no key, under policy.MissingKeyReject;
//   - payload_too_large: larger than policy.MaxPayloadBytes;
//   - key_refused: the store refuses its key;
//   - key_failed: the key generator failed with an error the policy caches.
//
// A router that also consumes the dead-letter topic must not run that
// handler through this receiver: add r.Middleware to the guarded handlers
// (handler.AddMiddleware), not to the router, or a dead letter that fails
// validation is dead-lettered again, without end.
func (b *Builder) WithDeadLetter(pub message.Publisher, topic string) *Builder {
	if pub == nil || topic == "" {
		return b.invalid("WithDeadLetter", "needs the publisher of the dead-letter topic and the topic's name; got publisher %v and topic %q", pub, topic)
	}
	b.cfg.DeadLetterPublisher, b.cfg.DeadLetterTopic = pub, topic
	return b
}

// WithTracerProvider sets where the span of each delivery goes (default:
// the global provider).
func (b *Builder) WithTracerProvider(tp trace.TracerProvider) *Builder {
	b.cfg.TracerProvider = tp
	return b
}

// WithMeterProvider sets where metrics go (default: the global provider).
func (b *Builder) WithMeterProvider(mp metric.MeterProvider) *Builder {
	b.cfg.MeterProvider = mp
	return b
}

// WithMessagingSystem says which broker the receiver reads from, as
// OpenTelemetry's messaging.system attribute: semconv.MessagingSystemKafka,
// semconv.MessagingSystemRabbitMQ, semconv.MessagingSystemAWSSQS
// (go.opentelemetry.io/otel/semconv/v1.40.0), or another value of that key:
// Watermill does not know. It is the messaging.system span attribute, and on
// Kafka and RabbitMQ, whose consumers take messages in order, Build refuses
// a policy that would hold up the messages behind a poison message for good
// (policy.ExhaustedKeep without WithDeadLetter), and logs a warning for
// policy.NeverCacheFailures, which asks for that on purpose.
func (b *Builder) WithMessagingSystem(system attribute.KeyValue) *Builder {
	if system.Key != semconv.MessagingSystemKey || system.Value.Type() != attribute.STRING || system.Value.AsString() == "" {
		return b.invalid("WithMessagingSystem", "%s=%s is not a messaging.system attribute; pass one such as semconv.MessagingSystemKafka", system.Key, system.Value.Emit())
	}
	b.cfg.MessagingSystem = system.Value.AsString()
	return b
}

// WithEventHandler is called once per delivery with what oncemill decided;
// use it for counting. It must be quick and safe for concurrent use.
func (b *Builder) WithEventHandler(f func(pipeline.Event)) *Builder {
	b.cfg.EventHandler = f
	return b
}

// WithShadow(true) turns shadow mode on, to roll the receiver out on a live
// consumer before it enforces anything (docs/operations.md, "Rolling out
// with shadow mode"): keys are computed, claimed and recorded as usual, but
// a duplicate (a replay, a held key, a mismatch), a message without a
// usable key and a delivery the store cannot decide run the handler
// unguarded, at once, instead of being answered by oncemill. Every delivery
// then ends as without oncemill: acked if the handler returned nil, nacked
// with its error otherwise, whatever the policy says (a cached failure, an
// exhausted message, policy.ExhaustedDrop), and nothing is dead-lettered.
// Validation (WithValidation) still refuses. Events report what enforcement
// would have done (pipeline.Event.Shadow), as do the metrics and the log
// lines; oncemill.shadow.duplicates counts the duplicates.
// WithShadow(false), the default, enforces. The bool lets a flag or an
// environment variable decide.
func (b *Builder) WithShadow(on bool) *Builder {
	b.cfg.Shadow = on
	return b
}

// WithKafkaWatermark turns the one-transaction mode into its watermark mode
// on Kafka (docs/kafka.md): one row per (consumer group, topic, partition)
// holds the next offset to process, moved in the handler's transaction, so
// a redelivery is told from new work with no record per message, and the
// last committed message's produced messages are replayed with their
// UUIDs. w.Position is kafkakeys.Position, w.HighWaterMark
// kafkakeys.HighWaterMark(client). Build refuses it with New (the lease
// mode), on a store without Kafka watermarks (store.KafkaWatermarks: not
// store/tiered), without a consumer group, and with WithKeyGenerator,
// WithFingerprint, WithScope or WithScopeFunc: the key is the position.
// It covers redeliveries only: a producer's duplicate at a new offset runs
// again (docs/kafka.md says how to add a content key).
func (b *Builder) WithKafkaWatermark(w pipeline.KafkaWatermark) *Builder {
	b.cfg.KafkaWatermark = &w
	return b
}

// WithDeferredClaim(true), in the one-transaction mode (NewTransactional),
// sends each delivery's claim with the handler's first statement instead
// of in a round trip of its own before the handler runs: a message costs
// one round trip less (docs/concepts.md, "What a duplicate gets"). A
// duplicate then runs the handler up to its first statement, which fails
// with an error wrapping store.ErrLeaseLost; nothing of that transaction
// commits, whatever the handler returns, and the delivery is answered as
// without it. Leave it off, the default, when the handler acts outside
// the database before its first statement. Build refuses it with New and
// with WithKafkaWatermark; shadow mode claims up front.
func (b *Builder) WithDeferredClaim(on bool) *Builder {
	b.cfg.DeferredClaim = on
	return b
}

// Build validates the configuration and returns the receiver. Every error
// is a *oncemill.ConfigError naming the builder method that set the value
// (WithPolicy(Policy.Heartbeat), WithRetry(RetryConfig.MaxTries)).
func (b *Builder) Build() (*Receiver, error) {
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	neverCached := inOrder(b.cfg.MessagingSystem) && b.cfg.Policy.NeverCacheFailures
	if !neverCached && inOrder(b.cfg.MessagingSystem) && b.cfg.DeadLetterPublisher == nil && b.cfg.Policy.Exhausted == policy.ExhaustedKeep {
		return nil, configerr.New("WithPolicy(Policy.Exhausted)", "is ExhaustedKeep on %s without a dead letter, so a message whose attempts run out would hold up the messages behind it for good; add WithDeadLetter(pub, topic), or set policy.ExhaustedDrop to ack such messages with an error log", b.cfg.MessagingSystem)
	}
	var (
		stage middleware
		err   error
	)
	if b.ctor == "NewTransactional" {
		stage, err = idempotency.NewTransactional(b.ts, b.cfg)
	} else {
		stage, err = idempotency.NewLeased(b.st, b.cfg)
	}
	if err != nil {
		return nil, err
	}
	if neverCached {
		b.warnNeverCached()
	}
	return &Receiver{stage: stage}, nil
}

// warnNeverCached says, once, what policy.NeverCacheFailures costs on a
// broker that takes messages in order. Build accepts it there, where it
// refuses ExhaustedKeep without a dead letter: that is the zero policy,
// which would hold up a partition by default; this is a choice made on
// purpose, and no dead letter could end the loop it asks for.
func (b *Builder) warnNeverCached() {
	logger := cmp.Or(b.cfg.Logger, slog.Default())
	logger.Warn("policy.NeverCacheFailures on a broker that takes messages in order: a message that always fails is never acked and holds up the messages behind it until the broker's own limit moves it (a RabbitMQ quorum queue's delivery limit) or an operator acts; Kafka has no such limit",
		slog.String("messaging_system", b.cfg.MessagingSystem))
}

// inOrder reports the brokers whose consumer is handed the next message only
// after the current one is acked or nacked, and which redeliver a nacked
// message first: a Kafka partition, and a RabbitMQ queue (a requeued
// message goes back to its place at the head). There a message nacked for
// good holds up every message behind it.
func inOrder(system string) bool {
	return system == semconv.MessagingSystemKafka.Value.AsString() || system == semconv.MessagingSystemRabbitMQ.Value.AsString()
}

// middleware is either mode's stage: *idempotency.Leased or
// *idempotency.Transactional.
type middleware interface {
	Middleware(h message.HandlerFunc) message.HandlerFunc
}

// Receiver is a built receiver: the idempotency stage of the chosen mode,
// with validation, retry and the circuit breaker inside it in the fixed
// order (docs/pipeline.md).
type Receiver struct {
	stage middleware
}

// Middleware is the receiver as a Watermill middleware: add it to a router
// (router.AddMiddleware) or to one handler (handler.AddMiddleware).
func (r *Receiver) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return r.stage.Middleware(h)
}
