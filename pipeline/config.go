package pipeline

import (
	"context"
	"log/slog"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/internal/kafkapos"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// Config configures the idempotency stage of either mode (NewLeased,
// NewTransactional). Every zero field means its default, so Config{} guards
// by message UUID under the zero policy.Policy, with no validation, retry,
// circuit breaker or dead letter. Each field is named after the
// receiver.Builder method that sets it (KeyGenerator: WithKeyGenerator),
// and a ConfigError names the field as "Config.<Field>".
type Config struct {
	// KeyGenerator says who a message is. Nil means keygen.UUID().
	KeyGenerator keygen.Generator
	// Fingerprint identifies the payload for mismatch detection. Nil uses
	// the generator's own (keygen.Fingerprinter), else
	// keygen.PayloadFingerprint; return "" to turn detection off
	// (keygen.NoFingerprint).
	Fingerprint func(*message.Message) string
	// Scope names the key space. Empty uses the Watermill handler name from
	// the message context, so two handlers of one topic each run a message
	// once.
	Scope string
	// ScopeFunc, when set, computes the key space of each message (a
	// tenant from its metadata, say), so that one receiver serves many
	// tenants whose keys may collide. It cannot be set with Scope. A scope
	// no store can hold is hashed, as a key is (keygen.StorableKey). An
	// error is treated as a key generator's: one wrapping keygen.ErrNoKey,
	// and an empty scope, as policy.MissingKey says; one the policy caches
	// rejects the message; any other nacks it after NackDelay.
	ScopeFunc func(*message.Message) (string, error)
	// RetentionFor overrides the policy's TTLs for the handlers it names
	// (Watermill handler names, message.HandlerNameFromCtx): a handler
	// whose outcomes must be kept longer, or shorter, than the others' of
	// the same receiver. A handler it does not name uses the policy's.
	RetentionFor map[string]Retention
	// Policy decides TTLs, the lease, attempts and classification. Its zero
	// fields mean their defaults.
	Policy policy.Policy
	// Logger receives the stage's lines. Nil means slog.Default(), so a
	// message acked without running (rejected, dropped), a dead letter that
	// could not be forwarded and a store that could not decide a delivery
	// are never silent.
	Logger *slog.Logger
	// ReplayLogLevel, when set, is the level at which each replay is logged
	// through Logger, with its scope, key, original outcome and age: a
	// slog.Level or a *slog.LevelVar. Nil logs no replays, and costs the
	// replay path nothing. In shadow mode (Shadow) it is the level of the
	// line for each duplicate the handler ran for, with what enforcement
	// would have done.
	ReplayLogLevel slog.Leveler
	// EventHandler, when set, is called once per delivery, after the
	// decision and before the router acks or nacks. It must be quick and
	// safe for concurrent use.
	EventHandler func(Event)
	// Validation, when set, runs first: a message for which it returns an
	// error is never stored and never retried; it is acked, counted, and
	// dead-lettered if a dead letter is set.
	Validation func(*message.Message) error
	// Retry, when set, retries retryable failures in process before the
	// broker redelivers: around the circuit breaker, inside the claim, each
	// attempt with a fresh transaction in the one-transaction mode.
	Retry *RetryConfig
	// CircuitBreaker, when set, runs each attempt through a
	// sony/gobreaker/v2 circuit breaker with these settings; their zero
	// fields mean gobreaker's defaults, and an empty Name means "oncemill".
	// A nil IsSuccessful counts what Policy caches as a success (a business
	// rule said no: the dependency answered) and only retryable failures
	// against the circuit. OnStateChange is called besides the
	// oncemill.breaker.state gauge.
	CircuitBreaker *gobreaker.Settings
	// DeadLetterPublisher and DeadLetterTopic, when set (both or neither),
	// receive each invalid message, cached failure and rejected message
	// (mismatch, no key, too large) once, before it is acked.
	DeadLetterPublisher message.Publisher
	DeadLetterTopic     string
	// TracerProvider and MeterProvider default to the global providers.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// MessagingSystem is the messaging.system span attribute ("kafka",
	// "rabbitmq", "aws_sqs"); Watermill does not know it. Empty means
	// "watermill".
	MessagingSystem string
	// Shadow, when true, measures without enforcing, for rolling out on a
	// live consumer: keys are computed, claimed and recorded as usual, but
	// a delivery the stage would answer without running the handler (a
	// replay, a held key, a mismatch, no usable key) and one the store
	// cannot decide run the handler unguarded instead, at once, with no
	// claim and no record.
	// Events report what enforcement would have done (Event.Shadow), and
	// oncemill.shadow.duplicates counts the duplicates by decision.
	Shadow bool
	// KafkaWatermark, when set, turns the one-transaction mode
	// (NewTransactional) into its watermark mode on Kafka (docs/kafka.md):
	// one row per (consumer group, topic, partition) instead of a record
	// per message. The key is the message's position, so KeyGenerator,
	// Fingerprint, Scope and ScopeFunc must be left unset; the store must
	// implement store.KafkaWatermarks (store/postgres). NewLeased refuses it.
	KafkaWatermark *KafkaWatermark
	// DeferredClaim, in the one-transaction mode (NewTransactional), sends
	// a delivery's claim with the handler's first statement, in the
	// transaction's first round trip (store.TxRequest.Deferrable), rather
	// than in a round trip of its own before the handler runs: a message
	// costs one round trip less. A duplicate then runs the handler up to
	// its first statement, which fails; nothing of that transaction
	// commits, whatever the handler returns, and the delivery is answered
	// as usual (a replay, a wait, a rejection), claimed again up front.
	// Leave it off when the handler acts outside the database before its
	// first statement. Shadow mode claims up front. NewLeased and the
	// watermark mode refuse it.
	DeferredClaim bool
}

// KafkaWatermark configures the watermark mode (Config.KafkaWatermark).
// With watermill-kafka:
//
//	pipeline.KafkaWatermark{
//		Group:         "orders",                          // the subscriber's ConsumerGroup
//		Position:      kafkakeys.Position,
//		HighWaterMark: kafkakeys.HighWaterMark(client), // a sarama.Client
//	}
type KafkaWatermark struct {
	// Group is the subscriber's consumer group: watermill-kafka's message
	// context does not carry it. Required: a consumer without a group reads
	// its partitions from its initial offset on every start, and the
	// offsets it re-reads would all be duplicates.
	Group string
	// Position returns where the message sits: kafkakeys.Position. An error
	// wrapping keygen.ErrNoKey (a message not consumed from Kafka) is
	// handled as policy.MissingKey says. Required.
	Position func(*message.Message) (store.KafkaPosition, error)
	// HighWaterMark returns a partition's high-water mark, checked against
	// the stored watermark once per partition and process, when the first
	// message below the watermark comes (store.KafkaWatermarks).
	// Required.
	HighWaterMark func(ctx context.Context, topic string, partition int32) (int64, error)
}

// watermarkStore checks cfg.KafkaWatermark and returns the store of its
// claims, with cfg's key and scope set to the mode's. The fields it sets
// are the ones it refuses, so a ConfigError names what the user set.
func watermarkStore(ts store.Transactional, cfg *Config) (store.Transactional, error) {
	w := cfg.KafkaWatermark
	const setting = "Config.KafkaWatermark"
	switch {
	case w.Group == "":
		return nil, configerr.New(setting, "has no consumer group: the watermarks follow a group's committed progress, and a consumer without a group re-reads its partitions on every start, which would all be duplicates; pass the subscriber's ConsumerGroup")
	case w.Position == nil:
		return nil, configerr.New(setting, "has no Position; pass kafkakeys.Position")
	case w.HighWaterMark == nil:
		return nil, configerr.New(setting, "has no HighWaterMark; pass kafkakeys.HighWaterMark(client) with a sarama.Client of the cluster, which the mode asks to detect a recreated topic")
	case cfg.KeyGenerator != nil:
		return nil, configerr.New("Config.KeyGenerator", "is set with the Kafka watermark mode, whose key is the message's position; leave it unset (for duplicates at new offsets, see docs/kafka.md)")
	case cfg.Fingerprint != nil:
		return nil, configerr.New("Config.Fingerprint", "is set with the Kafka watermark mode, which stores no fingerprint: one offset is one record; leave it unset")
	case cfg.Scope != "" || cfg.ScopeFunc != nil:
		return nil, configerr.New("Config.Scope", "is set with the Kafka watermark mode, whose rows are (consumer group, topic, partition); leave Scope and ScopeFunc unset")
	}
	kw, ok := ts.(store.KafkaWatermarks)
	if !ok {
		return nil, configerr.New(setting, "needs a store that keeps Kafka watermarks (store.KafkaWatermarks: store/postgres); %T does not", ts)
	}
	wts, err := kw.KafkaWatermarks(w.Group, w.HighWaterMark)
	if err != nil {
		return nil, configerr.New(setting, "%w", err)
	}
	position := w.Position
	cfg.KeyGenerator = keygen.Func(func(msg *message.Message) (string, error) {
		p, err := position(msg)
		if err != nil {
			return "", err
		}
		return kafkapos.Key(p), nil
	})
	cfg.Fingerprint = keygen.NoFingerprint
	cfg.Scope = keygen.StorableKey(w.Group, store.MaxScopeLen)
	return wts, nil
}

// RetryConfig configures in-process retries: cenkalti/backoff/v5's
// exponential backoff. Every zero field means its default, so
// RetryConfig{} is 3 tries, waits from 100ms doubling to at most 2s with
// ±50% jitter, at most 10s in all. Only what the policy classifies as
// retryable is retried.
type RetryConfig struct {
	// InitialInterval is the first wait. Zero means 100ms.
	InitialInterval time.Duration
	// Multiplier grows each wait. Zero means 2; it must be 1 or more.
	Multiplier float64
	// MaxInterval caps each wait. Zero means 2s, or InitialInterval when
	// that is longer.
	MaxInterval time.Duration
	// RandomizationFactor is the jitter: each wait is ±this fraction.
	// Zero means 0.5; a negative value means no jitter.
	RandomizationFactor float64
	// MaxElapsedTime bounds the time spent retrying one delivery. Zero
	// means 10s.
	MaxElapsedTime time.Duration
	// MaxTries counts the first try; 1 disables retrying. Zero means 3.
	MaxTries int
	// OnRetry, when set, is called before each wait.
	OnRetry func(try int, err error, wait time.Duration)
}

// configure validates cfg against the store's limits, in one place for
// both modes, and sets up what the two modes share.
func (s *idempotency) configure(cfg Config, limits store.Limits) error {
	bad := func(setting, format string, args ...any) error {
		return configerr.New(setting, format, args...)
	}
	if !keygen.Storable(cfg.Scope) || len(cfg.Scope) > store.MaxScopeLen {
		return bad("Config.Scope", "%.40q is not a scope every store holds: use valid UTF-8 without NUL bytes, at most %d bytes (store.MaxScopeLen)", cfg.Scope, store.MaxScopeLen)
	}
	if cfg.ScopeFunc != nil && cfg.Scope != "" {
		return bad("Config.ScopeFunc", "set together with Config.Scope: a scope is either fixed or computed per message; keep one")
	}
	if (cfg.DeadLetterPublisher == nil) != (cfg.DeadLetterTopic == "") {
		return bad("Config.DeadLetterTopic", "set together with DeadLetterPublisher: set both, the publisher and the topic to forward to, or neither")
	}
	if err := cfg.Policy.Validate(); err != nil {
		return err
	}
	p := cfg.Policy.WithDefaults()
	if limits.MaxResultBytes > 0 && p.MaxResultBytes > limits.MaxResultBytes {
		// A success whose produced messages fit the policy but not the
		// store could not be recorded at all.
		return bad("policy.MaxResultBytes", "%d is above the store's limit of %d; lower it, or raise the store's (its Options.MaxResultBytes)",
			p.MaxResultBytes, limits.MaxResultBytes)
	}
	tel, err := newTelemetry(cfg.TracerProvider, cfg.MeterProvider, cfg.MessagingSystem)
	if err != nil {
		return err
	}
	retentions, err := retentionsFor(cfg.RetentionFor, p)
	if err != nil {
		return err
	}
	*s = idempotency{
		ttl:         newRetention(Retention{}, p),
		retentions:  retentions,
		keys:        cfg.KeyGenerator,
		fingerprint: cfg.Fingerprint,
		scope:       cfg.Scope,
		scopeOf:     cfg.ScopeFunc,
		policy:      p,
		logger:      cfg.Logger,
		replayLevel: cfg.ReplayLogLevel,
		onEvent:     cfg.EventHandler,
		validate:    cfg.Validation,
		tel:         tel,
		maxKeyLen:   limits.MaxKeyLen,
		shadow:      cfg.Shadow,
	}
	if s.keys == nil {
		s.keys = keygen.UUID()
	}
	if s.fingerprint == nil {
		s.fingerprint = keygen.PayloadFingerprint
		if f, ok := s.keys.(keygen.Fingerprinter); ok {
			s.fingerprint = f.Fingerprint
		}
	}
	if s.logger == nil {
		s.logger = slog.Default()
	}
	if cfg.DeadLetterPublisher != nil {
		s.deadLetter = &deadLetter{pub: cfg.DeadLetterPublisher, topic: cfg.DeadLetterTopic}
	}
	if cfg.Retry != nil {
		if s.retry, err = newRetrier(*cfg.Retry, p.Classify, tel); err != nil {
			return err
		}
	}
	if st := cfg.CircuitBreaker; st != nil {
		// gobreaker takes a negative value for its default; a negative
		// duration is more likely a mistake than a wish for the default.
		switch {
		case st.Timeout < 0:
			return bad("Config.CircuitBreaker.Timeout", "%v is negative; set how long the circuit stays open, or leave it 0 for gobreaker's 60s", st.Timeout)
		case st.Interval < 0:
			return bad("Config.CircuitBreaker.Interval", "%v is negative; set how often the counts clear while closed, or leave it 0 to never clear them", st.Interval)
		}
		s.breaker = newBreaker(*st, p.Classify, tel)
	}
	return nil
}
