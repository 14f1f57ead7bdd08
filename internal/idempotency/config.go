package idempotency

import (
	"fmt"
	"log/slog"
	"math"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/internal/kafkapos"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// Config configures the idempotency stage of either mode (NewLeased,
// NewTransactional). receiver.Builder fills it: each field is set by the
// With method of its name (KeyGenerator by WithKeyGenerator;
// DeadLetterPublisher and DeadLetterTopic by WithDeadLetter), whose doc
// says what it does, and every ConfigError names that method. Every zero
// field means its default, so Config{} guards by message UUID under the
// zero policy.Policy, with no validation, retry, circuit breaker or dead
// letter.
type Config struct {
	// KeyGenerator nil means keygen.UUID().
	KeyGenerator keygen.Generator
	// Fingerprint nil uses the generator's own (keygen.Fingerprinter),
	// else keygen.PayloadFingerprint.
	Fingerprint func(*message.Message) string
	// Scope empty uses the Watermill handler name from the message
	// context. It cannot be set with ScopeFunc.
	Scope     string
	ScopeFunc func(*message.Message) (string, error)
	// RetentionFor overrides the policy's TTLs for the handlers it names.
	RetentionFor map[string]Retention
	Policy       policy.Policy
	// Logger nil means slog.Default().
	Logger         *slog.Logger
	EventHandler   func(pipeline.Event)
	Validation     func(*message.Message) error
	Retry          *pipeline.RetryConfig
	CircuitBreaker *gobreaker.Settings
	// DeadLetterPublisher and DeadLetterTopic are set both or neither.
	DeadLetterPublisher message.Publisher
	DeadLetterTopic     string
	// TracerProvider and MeterProvider nil mean the global providers.
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	// MessagingSystem empty means "watermill".
	MessagingSystem string
	Shadow          bool
	// KafkaWatermark and DeferredClaim are the one-transaction mode's;
	// NewLeased refuses them.
	KafkaWatermark *pipeline.KafkaWatermark
	DeferredClaim  bool
}

// watermarkStore checks cfg.KafkaWatermark and returns the store of its
// claims, with cfg's key and scope set to the mode's. The fields it sets
// are the ones it refuses, so a ConfigError names what the user set.
func watermarkStore(ts store.Transactional, cfg *Config) (store.Transactional, error) {
	w := cfg.KafkaWatermark
	const setting = "WithKafkaWatermark"
	switch {
	case w.Group == "":
		return nil, configerr.New(setting, "has no consumer group: the watermarks follow a group's committed progress, and a consumer without a group re-reads its partitions on every start, which would all be duplicates; pass the subscriber's ConsumerGroup")
	case w.Position == nil:
		return nil, configerr.New(setting, "has no Position; pass kafkakeys.Position")
	case w.HighWaterMark == nil:
		return nil, configerr.New(setting, "has no HighWaterMark; pass kafkakeys.HighWaterMark(client) with a sarama.Client of the cluster, which the mode asks to detect a recreated topic")
	case cfg.KeyGenerator != nil:
		return nil, configerr.New("WithKeyGenerator", "is set with the Kafka watermark mode, whose key is the message's position; leave it unset (for duplicates at new offsets, see docs/kafka.md)")
	case cfg.Fingerprint != nil:
		return nil, configerr.New("WithFingerprint", "is set with the Kafka watermark mode, which stores no fingerprint: one offset is one record; leave it unset")
	case cfg.Scope != "" || cfg.ScopeFunc != nil:
		return nil, configerr.New("WithScope", "is set with the Kafka watermark mode, whose rows are (consumer group, topic, partition); leave Scope and ScopeFunc unset")
	}
	kw, ok := ts.(store.KafkaWatermarks)
	if !ok {
		return nil, configerr.New(setting, "needs a store that keeps Kafka watermarks (store.KafkaWatermarks: store/postgres); %T does not", ts)
	}
	wts, err := kw.KafkaWatermarks(w.Group, w.HighWaterMark)
	if err != nil {
		return nil, configerr.New(setting, "%w", err)
	}
	position, maxKeyLen := w.Position, wts.Limits().MaxKeyLen
	cfg.KeyGenerator = keygen.Func(func(msg *message.Message) (string, error) {
		p, err := position(msg)
		if err != nil {
			return "", err
		}
		// The watermark is the next offset, offset+1: the last offset
		// Kafka can hold has none, and a negative one is no record's.
		if p.Partition < 0 || p.Offset < 0 || p.Offset == math.MaxInt64 {
			return "", fmt.Errorf("%w: partition %d, offset %d of topic %.80q is not a position the watermark can follow (partitions and offsets run from 0 to 2^63-2)", keygen.ErrNoKey, p.Partition, p.Offset, p.Topic)
		}
		key := kafkapos.Key(p)
		if keygen.StorableKey(key, maxKeyLen) != key { // hashed, it would name no position
			return "", fmt.Errorf("%w: topic %.80q cannot be stored as a watermark's topic: use valid UTF-8 without NUL bytes, its position at most %d bytes", keygen.ErrNoKey, p.Topic, maxKeyLen)
		}
		return key, nil
	})
	cfg.Fingerprint = keygen.NoFingerprint
	cfg.Scope = keygen.StorableKey(w.Group, store.MaxScopeLen)
	return wts, nil
}

// configure validates cfg against the store's limits, in one place for
// both modes, and sets up what the two modes share.
func (s *idempotency) configure(cfg Config, limits store.Limits) error {
	bad := func(setting, format string, args ...any) error {
		return configerr.New(setting, format, args...)
	}
	if keygen.StorableKey(cfg.Scope, store.MaxScopeLen) != cfg.Scope { // it would be hashed
		return bad("WithScope", "%.40q is not a scope every store holds: use valid UTF-8 without NUL bytes, at most %d bytes (store.MaxScopeLen)", cfg.Scope, store.MaxScopeLen)
	}
	if cfg.ScopeFunc != nil && cfg.Scope != "" {
		return bad("WithScope and WithScopeFunc", "both set: a scope is either fixed (WithScope) or computed per message (WithScopeFunc); keep one")
	}
	if (cfg.DeadLetterPublisher == nil) != (cfg.DeadLetterTopic == "") {
		return bad("WithDeadLetter", "needs the publisher of the dead-letter topic and the topic's name; got publisher %v and topic %q", cfg.DeadLetterPublisher, cfg.DeadLetterTopic)
	}
	if err := validatePolicy(cfg.Policy); err != nil {
		return err
	}
	p := cfg.Policy.WithDefaults()
	if limits.MaxResultBytes > 0 && p.MaxResultBytes > limits.MaxResultBytes {
		// A success whose produced messages fit the policy but not the
		// store could not be recorded at all.
		return bad("WithPolicy(Policy.MaxResultBytes)", "%d is above the store's limit of %d; lower it, or raise the store's (its Options.MaxResultBytes)",
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
			return bad("WithCircuitBreaker(gobreaker.Settings.Timeout)", "%v is negative; set how long the circuit stays open, or leave it 0 for gobreaker's 60s", st.Timeout)
		case st.Interval < 0:
			return bad("WithCircuitBreaker(gobreaker.Settings.Interval)", "%v is negative; set how often the counts clear while closed, or leave it 0 to never clear them", st.Interval)
		}
		s.breaker = newBreaker(*st, p.Classify, tel)
	}
	return nil
}
