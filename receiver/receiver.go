package receiver

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// ErrInvalidConfig is wrapped by every error Build returns.
var ErrInvalidConfig = errors.New("oncemill: invalid receiver configuration")

// Builder collects the receiver's configuration. Each With method returns the
// builder; Build validates everything at once.
type Builder struct {
	cfg          pipeline.IdempotencyConfig
	heartbeatSet bool
	errs         []error

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
// policy.Default. The lease mode claims a key with a statement of its own,
// keeps the lease alive with a heartbeat while the handler runs, and
// records the outcome after it: for records kept apart from the business
// data (memory, Redis, another database).
func New(st store.Store) *Builder {
	return &Builder{cfg: pipeline.IdempotencyConfig{
		Store:  st,
		Keys:   keygen.UUID(),
		Policy: policy.Default(),
	}}
}

// NewTransactional starts a builder in the one-transaction mode over ts
// (store/postgres), with the defaults of New. The key is claimed by the
// first statement of the handler's own transaction, which the handler
// finds in its context (postgres.TxFromContext), and the success commits
// with the handler's writes or not at all. A concurrent duplicate waits for
// that transaction, up to the in-progress bound. There is no lease to keep
// alive: WithLease and WithHeartbeat do not apply.
func NewTransactional(ts store.Transactional) *Builder {
	return &Builder{cfg: pipeline.IdempotencyConfig{
		TxStore: ts,
		Keys:    keygen.UUID(),
		Policy:  policy.Default(),
	}}
}

func (b *Builder) invalid(format string, args ...any) *Builder {
	b.errs = append(b.errs, fmt.Errorf(format, args...))
	return b
}

// WithKeyGenerator sets who a message is (default keygen.UUID()).
func (b *Builder) WithKeyGenerator(g keygen.Generator) *Builder {
	if g == nil {
		return b.invalid("WithKeyGenerator(nil): pass a generator such as keygen.UUID()")
	}
	b.cfg.Keys = g
	return b
}

// WithFingerprint sets how the payload is fingerprinted for mismatch
// detection (default: the generator's own, else SHA-256 of the payload).
func (b *Builder) WithFingerprint(f func(*message.Message) string) *Builder {
	if f == nil {
		return b.invalid("WithFingerprint(nil): use WithoutFingerprint to turn mismatch detection off")
	}
	b.cfg.Fingerprint = f
	return b
}

// WithoutFingerprint turns mismatch detection off: a key seen again with a
// different payload is treated as a duplicate.
func (b *Builder) WithoutFingerprint() *Builder {
	b.cfg.Fingerprint = func(*message.Message) string { return "" }
	return b
}

// WithScope sets the key space (default: the Watermill handler name).
// Use it to share records across handlers, or to separate tenants.
func (b *Builder) WithScope(scope string) *Builder {
	if scope == "" {
		return b.invalid("WithScope(\"\"): leave it unset to scope by handler name, or pass a name")
	}
	b.cfg.Scope = scope
	return b
}

// WithPolicy replaces the whole policy (default policy.Default()); the
// With methods below change one field of it. Build validates it.
func (b *Builder) WithPolicy(p policy.Policy) *Builder {
	b.cfg.Policy = p
	b.heartbeatSet = true
	return b
}

// WithSuccessTTL sets how long a success is replayed (default 24h).
func (b *Builder) WithSuccessTTL(d time.Duration) *Builder {
	b.cfg.Policy.SuccessTTL = d
	return b
}

// WithFailureTTL sets how long a cached failure, and the attempt count of a
// released key, are remembered (default 1h).
func (b *Builder) WithFailureTTL(d time.Duration) *Builder {
	b.cfg.Policy.FailureTTL = d
	return b
}

// WithLease sets the lease length (default 30s). Unless WithHeartbeat is
// called, the heartbeat is a third of the lease.
func (b *Builder) WithLease(d time.Duration) *Builder {
	b.cfg.Policy.Lease = d
	return b
}

// WithHeartbeat sets how often a running handler extends its lease; it must
// be shorter than the lease.
func (b *Builder) WithHeartbeat(d time.Duration) *Builder {
	b.cfg.Policy.Heartbeat = d
	b.heartbeatSet = true
	return b
}

// WithMaxAttempts caps executions of one key across redeliveries (default 5);
// the failure of the last one is cached.
func (b *Builder) WithMaxAttempts(n int) *Builder {
	b.cfg.Policy.MaxAttempts = n
	return b
}

// WithInProgress sets what a duplicate does while another delivery holds its
// key: policy.Wait up to wait, policy.Nack, or policy.Reject.
func (b *Builder) WithInProgress(mode policy.InProgressMode, wait time.Duration) *Builder {
	b.cfg.Policy.InProgress = mode
	b.cfg.Policy.InProgressWait = wait
	return b
}

// WithNackDelay sets the pause before an in-progress duplicate is nacked.
func (b *Builder) WithNackDelay(d time.Duration) *Builder {
	b.cfg.Policy.NackDelay = d
	return b
}

// WithMissingKey sets what happens when no key can be computed.
func (b *Builder) WithMissingKey(mode policy.MissingKeyMode) *Builder {
	b.cfg.Policy.MissingKey = mode
	return b
}

// WithMaxResultBytes bounds the stored produced messages of one success.
func (b *Builder) WithMaxResultBytes(n int) *Builder {
	b.cfg.Policy.MaxResultBytes = n
	return b
}

// WithMaxPayloadBytes bounds the incoming payload; larger messages are
// rejected as permanent failures.
func (b *Builder) WithMaxPayloadBytes(n int) *Builder {
	b.cfg.Policy.MaxPayloadBytes = n
	return b
}

// WithCachedErrors adds errors (matched with errors.Is) whose failures are
// cached and not retried.
func (b *Builder) WithCachedErrors(errs ...error) *Builder {
	b.cfg.Policy.CachedErrors = append(b.cfg.Policy.CachedErrors, errs...)
	return b
}

// WithRetryableErrors adds errors (matched with errors.Is) that are always retried.
func (b *Builder) WithRetryableErrors(errs ...error) *Builder {
	b.cfg.Policy.RetryableErrors = append(b.cfg.Policy.RetryableErrors, errs...)
	return b
}

// WithClassifier sets a predicate asked before every other rule; returning
// ok=false falls through to them.
func (b *Builder) WithClassifier(f func(error) (policy.Class, bool)) *Builder {
	b.cfg.Policy.Classifier = f
	return b
}

// WithLogger sets the Watermill logger (default: none).
func (b *Builder) WithLogger(l watermill.LoggerAdapter) *Builder {
	b.cfg.Logger = l
	return b
}

// WithSlog sends oncemill's logs to an slog logger (through Watermill's
// slog adapter).
func (b *Builder) WithSlog(l *slog.Logger) *Builder {
	if l == nil {
		return b.invalid("WithSlog(nil): pass a logger such as slog.Default()")
	}
	b.cfg.Logger = watermill.NewSlogLogger(l)
	return b
}

// WithValidation adds the validation stage: a message for which validate
// returns an error is never stored and never retried; it is acked, counted,
// and dead-lettered if WithDeadLetter is set.
func (b *Builder) WithValidation(validate func(*message.Message) error) *Builder {
	if validate == nil {
		return b.invalid("WithValidation(nil): pass a func(*message.Message) error")
	}
	b.validate = validate
	return b
}

// WithRetry adds in-process retries of retryable failures. Start from
// pipeline.DefaultRetryConfig(); the receiver's error classification is used
// whatever cfg.Policy says.
func (b *Builder) WithRetry(cfg pipeline.RetryConfig) *Builder {
	b.retry = &cfg
	return b
}

// WithCircuitBreaker adds a circuit breaker around the handler. Start from
// pipeline.DefaultBreakerConfig(); the receiver's error classification is
// used whatever cfg.Policy says.
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
		return b.invalid("WithSeparateTransaction(nil): pass a transaction manager such as postgres.NewTxManager(pool, pgx.TxOptions{})")
	}
	b.tx = tm
	return b
}

// WithDeadLetter forwards invalid messages, cached failures and rejected
// messages (mismatch, no key, too large) once to topic on pub, with reason
// metadata in the style of Watermill's PoisonQueue, before acking them.
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

// WithMessagingSystem sets the messaging.system span attribute ("kafka",
// "rabbitmq", "aws_sqs"); Watermill does not know which broker it reads.
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
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(b.errs...))
	}
	chain, err := b.chain()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Receiver{chain: chain.Middleware}, nil
}

// chain builds every configured stage; pipeline.Chain fixes their order.
func (b *Builder) chain() (pipeline.Chain, error) {
	var c pipeline.Chain
	tel, err := pipeline.NewTelemetry(b.telemetry)
	if err != nil {
		return c, err
	}
	c.Telemetry = tel
	cfg := b.cfg
	cfg.Telemetry = tel
	if !b.heartbeatSet {
		cfg.Policy.Heartbeat = cfg.Policy.Lease / 3
	}
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
		rc.Policy, rc.Telemetry = cfg.Policy, tel
		if c.Retry, err = pipeline.NewRetry(rc); err != nil {
			return c, fmt.Errorf("%w (start from pipeline.DefaultRetryConfig())", err)
		}
	}
	if b.breaker != nil {
		bc := *b.breaker
		bc.Policy, bc.Telemetry = cfg.Policy, tel
		if c.Breaker, err = pipeline.NewBreaker(bc); err != nil {
			return c, fmt.Errorf("%w (start from pipeline.DefaultBreakerConfig())", err)
		}
	}
	if b.tx != nil {
		if cfg.TxStore != nil {
			return c, errors.New("WithSeparateTransaction with NewTransactional: the one-transaction mode already runs the handler in the store's transaction; drop WithSeparateTransaction")
		}
		if c.Transaction, err = pipeline.NewTransaction(b.tx); err != nil {
			return c, err
		}
	}
	return c, nil
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

// Wrap returns h guarded by the receiver, for use without router middleware.
func (r *Receiver) Wrap(h message.HandlerFunc) message.HandlerFunc {
	return r.chain(h)
}
