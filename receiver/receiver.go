package receiver

import (
	"errors"
	"log/slog"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// Builder collects the receiver's configuration. Each With method returns the
// builder; Build validates everything at once.
type Builder struct {
	cfg  pipeline.IdempotencyConfig
	errs []error

	validate   func(*message.Message) error
	retry      *pipeline.RetryConfig
	breaker    *pipeline.BreakerConfig
	tx         pipeline.TxManager
	deadPub    message.Publisher
	deadTopic  string
	deadLetter bool
	telemetry  pipeline.TelemetryConfig
}

// New starts a builder in the lease mode over st, with the defaults: the
// message UUID as the key, the handler name as the scope, and
// the zero policy.Policy (its defaults). The lease mode claims a key with a statement of its own,
// keeps the lease alive with a heartbeat while the handler runs, and
// records the outcome after it: for records kept apart from the business
// data (memory, Redis, another database).
func New(st store.Store) *Builder {
	return &Builder{cfg: pipeline.IdempotencyConfig{
		Store: st,
		Keys:  keygen.UUID(),
	}}
}

// NewTransactional starts a builder in the one-transaction mode over ts
// (store/postgres), with the defaults of New. The key is claimed by the
// first statement of the handler's own transaction, which the handler
// finds in its context (postgres.TxFromContext), and the success commits
// with the handler's writes or not at all. A concurrent duplicate waits for
// that transaction, up to the policy's HeldKeyTimeout. There is no lease to keep
// alive: the policy's Lease and Heartbeat do not apply.
func NewTransactional(ts store.Transactional) *Builder {
	return &Builder{cfg: pipeline.IdempotencyConfig{
		TxStore: ts,
		Keys:    keygen.UUID(),
	}}
}

func (b *Builder) invalid(setting, format string, args ...any) *Builder {
	b.errs = append(b.errs, oncemill.InvalidConfig(setting, format, args...))
	return b
}

// WithKeyGenerator sets who a message is (default keygen.UUID()).
func (b *Builder) WithKeyGenerator(g keygen.Generator) *Builder {
	if g == nil {
		return b.invalid("WithKeyGenerator", "nil; pass a generator such as keygen.UUID()")
	}
	b.cfg.Keys = g
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
// Use it to share records across handlers, or to separate tenants.
func (b *Builder) WithScope(scope string) *Builder {
	if scope == "" {
		return b.invalid("WithScope", "empty; leave it unset to scope by handler name, or pass a name")
	}
	b.cfg.Scope = scope
	return b
}

// WithPolicy sets the policy: TTLs, the lease, attempts, what a duplicate
// does while its key is held, and how errors are classified. Its zero fields
// mean their defaults (policy.Policy), so a literal names only what it
// changes: WithPolicy(receiver.Policy{SuccessTTL: 7 * 24 * time.Hour}).
// Build validates it.
func (b *Builder) WithPolicy(p policy.Policy) *Builder {
	b.cfg.Policy = p
	return b
}

// WithLogger sets the logger of every stage, the same *slog.Logger the
// stores take. Nil, or no WithLogger at all, means slog.Default(): a
// rejected or dropped message, a dead letter that could not be forwarded
// and a store that could not decide a delivery are logged at error level
// either way, never silent.
func (b *Builder) WithLogger(l *slog.Logger) *Builder {
	b.cfg.Logger = l
	return b
}

// WithReplayLogLevel sets the level at which each replay is logged through
// WithLogger's logger, with its scope, key, original outcome (succeeded or
// failed) and age (default: replays are not logged). A replay rate that
// never falls, or ages far beyond the broker's redelivery horizon, point to
// a key that does not identify what it should (docs/operations.md).
func (b *Builder) WithReplayLogLevel(level slog.Level) *Builder {
	b.cfg.ReplayLogLevel = level
	return b
}

// WithValidation adds the validation stage: a message for which validate
// returns an error is never stored and never retried; it is acked, counted,
// and dead-lettered if WithDeadLetter is set.
func (b *Builder) WithValidation(validate func(*message.Message) error) *Builder {
	if validate == nil {
		return b.invalid("WithValidation", "nil; pass a func(*message.Message) error")
	}
	b.validate = validate
	return b
}

// WithRetry adds in-process retries of retryable failures. Zero fields of
// cfg mean their defaults: pipeline.RetryConfig{} is 3 tries. The stage
// classifies errors by the receiver's policy and records to its telemetry,
// so cfg.Classify and cfg.Telemetry must be left nil.
func (b *Builder) WithRetry(cfg pipeline.RetryConfig) *Builder {
	b.retry = &cfg
	return b
}

// WithCircuitBreaker adds a circuit breaker around the handler. Zero fields
// of cfg mean their defaults: pipeline.BreakerConfig{} opens after 5
// consecutive retryable failures. As for WithRetry, cfg.Classify and
// cfg.Telemetry must be left nil.
func (b *Builder) WithCircuitBreaker(cfg pipeline.BreakerConfig) *Builder {
	b.breaker = &cfg
	return b
}

// WithSeparateTransaction runs the handler of the lease mode inside a
// transaction of tm (such as postgres.NewTxManager), committed only after
// it succeeds. The record is written after that commit, apart from it: a
// crash in between runs the message again. It is for records kept
// elsewhere than the business data; when both are in one PostgreSQL
// database, NewTransactional commits them together.
func (b *Builder) WithSeparateTransaction(tm pipeline.TxManager) *Builder {
	if tm == nil {
		return b.invalid("WithSeparateTransaction", "nil; pass a transaction manager such as postgres.NewTxManager(pool, pgx.TxOptions{})")
	}
	b.tx = tm
	return b
}

// WithDeadLetter forwards invalid messages, cached failures and rejected
// messages (mismatch, no key, too large) once to topic on pub, with reason
// metadata in the style of Watermill's PoisonQueue, before acking them.
//
// A router that also consumes the dead-letter topic must not run that
// handler through this receiver: add r.Middleware to the guarded handlers
// (handler.AddMiddleware), not to the router, or a dead letter that fails
// validation is dead-lettered again, without end.
func (b *Builder) WithDeadLetter(pub message.Publisher, topic string) *Builder {
	b.deadPub, b.deadTopic, b.deadLetter = pub, topic, true
	return b
}

// WithTracerProvider sets where the span of each delivery goes (default:
// the global provider).
func (b *Builder) WithTracerProvider(tp trace.TracerProvider) *Builder {
	b.telemetry.TracerProvider = tp
	return b
}

// WithMeterProvider sets where metrics go (default: the global provider).
func (b *Builder) WithMeterProvider(mp metric.MeterProvider) *Builder {
	b.telemetry.MeterProvider = mp
	return b
}

// The messaging systems WithMessagingSystem names (OpenTelemetry's
// messaging.system values); any other value is accepted as well.
const (
	MessagingSystemKafka    = "kafka"
	MessagingSystemRabbitMQ = "rabbitmq"
	MessagingSystemSQS      = "aws_sqs"
)

// WithMessagingSystem says which broker the receiver reads from
// (MessagingSystemKafka, MessagingSystemRabbitMQ, MessagingSystemSQS):
// Watermill does not know. It is the messaging.system span attribute, and on
// Kafka and RabbitMQ, whose consumers take messages in order, Build refuses
// a policy that would hold up the messages behind a poison message for good
// (policy.ExhaustedKeep without WithDeadLetter).
func (b *Builder) WithMessagingSystem(system string) *Builder {
	b.telemetry.MessagingSystem = system
	return b
}

// WithEventHandler is called once per delivery with what oncemill decided;
// use it for counting. It must be quick and safe for concurrent use.
func (b *Builder) WithEventHandler(f func(pipeline.Event)) *Builder {
	b.cfg.OnEvent = f
	return b
}

// Build validates the configuration and returns the receiver.
func (b *Builder) Build() (*Receiver, error) {
	if len(b.errs) > 0 {
		return nil, errors.Join(b.errs...)
	}
	chain, err := b.chain()
	if err != nil {
		return nil, err
	}
	return &Receiver{chain: chain.Middleware}, nil
}

// chain builds every configured stage; pipeline.Chain fixes their order.
func (b *Builder) chain() (pipeline.Chain, error) {
	var c pipeline.Chain
	if b.cfg.TxStore != nil {
		// Settings the one-transaction mode has no use for: refused, not
		// ignored, so that nobody tunes what does nothing.
		switch {
		case b.tx != nil:
			return c, oncemill.InvalidConfig("WithSeparateTransaction", "the one-transaction mode (NewTransactional) already runs the handler in the store's transaction; drop WithSeparateTransaction")
		case b.cfg.Policy.LeaseDuration != 0:
			return c, oncemill.InvalidConfig("policy.LeaseDuration", "has no effect in the one-transaction mode (NewTransactional): the claim is held by the handler's open transaction; leave it 0")
		case b.cfg.Policy.Heartbeat != 0:
			return c, oncemill.InvalidConfig("policy.Heartbeat", "has no effect in the one-transaction mode (NewTransactional): there is no lease to extend; leave it 0")
		}
	}
	if inOrder(b.telemetry.MessagingSystem) && !b.deadLetter && b.cfg.Policy.Exhausted == policy.ExhaustedKeep {
		return c, oncemill.InvalidConfig("policy.Exhausted", "is ExhaustedKeep on %s without a dead letter, so a message whose attempts run out would hold up the messages behind it for good; set WithDeadLetter(pub, topic), or policy.ExhaustedDrop to ack such messages with an error log", b.telemetry.MessagingSystem)
	}
	tel, err := pipeline.NewTelemetry(b.telemetry)
	if err != nil {
		return c, err
	}
	c.Telemetry = tel
	cfg := b.cfg
	cfg.Telemetry = tel
	if b.deadLetter {
		if cfg.DeadLetter, err = pipeline.NewDeadLetter(b.deadPub, b.deadTopic); err != nil {
			return c, err
		}
	}
	if c.Idempotency, err = pipeline.NewIdempotency(cfg); err != nil {
		return c, err
	}
	if b.validate != nil {
		c.Validation, err = pipeline.NewValidation(pipeline.ValidationConfig{
			Validate: b.validate, DeadLetter: cfg.DeadLetter, Logger: cfg.Logger, OnEvent: cfg.OnEvent, Telemetry: tel,
		})
		if err != nil {
			return c, err
		}
	}
	if b.retry != nil {
		rc := *b.retry
		if rc.Classify != nil || rc.Telemetry != nil {
			return c, oncemill.InvalidConfig("WithRetry", "RetryConfig.Classify and Telemetry are the receiver's (WithPolicy, WithTracerProvider); leave them nil")
		}
		rc.Classify, rc.Telemetry = cfg.Policy.Classify, tel
		if c.Retry, err = pipeline.NewRetry(rc); err != nil {
			return c, err
		}
	}
	if b.breaker != nil {
		bc := *b.breaker
		if bc.Classify != nil || bc.Telemetry != nil {
			return c, oncemill.InvalidConfig("WithCircuitBreaker", "BreakerConfig.Classify and Telemetry are the receiver's (WithPolicy, WithTracerProvider); leave them nil")
		}
		bc.Classify, bc.Telemetry = cfg.Policy.Classify, tel
		if c.Breaker, err = pipeline.NewBreaker(bc); err != nil {
			return c, err
		}
	}
	if b.tx != nil {
		if c.Transaction, err = pipeline.NewTransaction(b.tx); err != nil {
			return c, err
		}
	}
	return c, nil
}

// inOrder reports the brokers whose consumer is handed the next message only
// after the current one is acked or nacked, and which redeliver a nacked
// message first: a Kafka partition, and a RabbitMQ queue (a requeued
// message goes back to its place at the head). There a message nacked for
// good holds up every message behind it.
func inOrder(system string) bool {
	return system == MessagingSystemKafka || system == MessagingSystemRabbitMQ
}

// Receiver is a built pipeline.
type Receiver struct {
	chain message.HandlerMiddleware
}

// Middleware is the receiver as a Watermill middleware: add it to a router
// (router.AddMiddleware) or to one handler (handler.AddMiddleware).
func (r *Receiver) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return r.chain(h)
}
