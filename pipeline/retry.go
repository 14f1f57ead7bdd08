package pipeline

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// RetryConfig configures in-process retries: cenkalti/backoff/v5's
// exponential backoff. Every zero field means its default, so
// RetryConfig{} is 3 tries, waits from 100ms doubling to at most 2s with
// ±50% jitter, at most 10s in all.
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
	// Classify sorts errors: only retryable ones are retried. Nil uses
	// policy.Policy{}.Classify (markers, then retryable). The receiver sets
	// it from its policy.
	Classify func(error) policy.Class
	// OnRetry, when set, is called before each wait.
	OnRetry func(try int, err error, wait time.Duration)
	// Telemetry records the retries. Nil uses the global OpenTelemetry
	// providers. The receiver sets it.
	Telemetry *Telemetry
}

func (c RetryConfig) withDefaults() RetryConfig {
	if c.InitialInterval == 0 {
		c.InitialInterval = 100 * time.Millisecond
	}
	if c.Multiplier == 0 {
		c.Multiplier = 2
	}
	if c.MaxInterval == 0 {
		c.MaxInterval = max(2*time.Second, c.InitialInterval)
	}
	switch {
	case c.RandomizationFactor == 0:
		c.RandomizationFactor = 0.5
	case c.RandomizationFactor < 0:
		c.RandomizationFactor = 0
	}
	if c.MaxElapsedTime == 0 {
		c.MaxElapsedTime = 10 * time.Second
	}
	if c.MaxTries == 0 {
		c.MaxTries = 3
	}
	if c.Classify == nil {
		c.Classify = policy.Policy{}.Classify
	}
	if c.Telemetry == nil {
		c.Telemetry = defaultTelemetry()
	}
	return c
}

// Retry retries retryable failures in process, before the broker redelivers.
// It stops at the first success, at a cached (permanent) failure, at a lost
// lease, at an open circuit (the breaker's pause is longer than any retry
// schedule; the broker's redelivery is the better wait), when the message's
// context ends, or when the schedule runs out; the
// last error then goes back to the idempotency stage, which classifies it.
// Inside the idempotency stage the lease's heartbeat keeps running while it
// waits.
type Retry struct {
	cfg RetryConfig
}

// NewRetry validates cfg and returns the retry stage.
func NewRetry(cfg RetryConfig) (*Retry, error) {
	bad := func(field, format string, args ...any) (*Retry, error) {
		return nil, oncemill.InvalidConfig("RetryConfig."+field, format, args...)
	}
	cfg = cfg.withDefaults()
	switch {
	case cfg.InitialInterval < 0:
		return bad("InitialInterval", "%v is negative; leave it 0 for 100ms", cfg.InitialInterval)
	case cfg.Multiplier < 1:
		return bad("Multiplier", "%v is below 1, so waits would shrink; use 1 or more, or leave it 0 for 2", cfg.Multiplier)
	case cfg.MaxInterval < cfg.InitialInterval:
		return bad("MaxInterval", "%v is below InitialInterval %v; raise it, or leave it 0", cfg.MaxInterval, cfg.InitialInterval)
	case cfg.RandomizationFactor >= 1:
		return bad("RandomizationFactor", "%v would allow waits of zero; use a value below 1, or leave it 0 for 0.5", cfg.RandomizationFactor)
	case cfg.MaxElapsedTime < 0:
		return bad("MaxElapsedTime", "%v is negative; leave it 0 for 10s", cfg.MaxElapsedTime)
	case cfg.MaxTries < 0:
		return bad("MaxTries", "%d is negative; use 1 to disable retrying, or leave it 0 for 3", cfg.MaxTries)
	}
	return &Retry{cfg: cfg}, nil
}

// Middleware is the stage as a Watermill middleware.
func (r *Retry) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := h(msg)
		if err == nil || !r.retryable(err) || r.cfg.MaxTries == 1 {
			return out, err
		}
		return r.retry(h, msg, err)
	}
}

// retry is the slow path, after a first retryable failure.
func (r *Retry) retry(h message.HandlerFunc, msg *message.Message, err error) ([]*message.Message, error) {
	schedule := &backoff.ExponentialBackOff{
		InitialInterval:     r.cfg.InitialInterval,
		RandomizationFactor: r.cfg.RandomizationFactor,
		Multiplier:          r.cfg.Multiplier,
		MaxInterval:         r.cfg.MaxInterval,
	}
	deadline := time.Now().Add(r.cfg.MaxElapsedTime)
	for try := 1; ; try++ {
		wait := schedule.NextBackOff()
		if try >= r.cfg.MaxTries || time.Now().Add(wait).After(deadline) {
			return nil, fmt.Errorf("oncemill: gave up after %d tries: %w", try, err)
		}
		if r.cfg.OnRetry != nil {
			r.cfg.OnRetry(try, err, wait)
		}
		r.cfg.Telemetry.retried(msg.Context())
		if serr := sleep(msg.Context(), wait); serr != nil {
			return nil, fmt.Errorf("oncemill: retry stopped after %d tries (%w): %w", try, serr, err)
		}
		var out []*message.Message
		if out, err = h(msg); err == nil || !r.retryable(err) {
			return out, err
		}
	}
}

// retryable: the policy says so, the lease is still ours (a lost lease
// means another delivery owns the key now), and the circuit is not open.
func (r *Retry) retryable(err error) bool {
	return r.cfg.Classify(err) == policy.ClassRetryable &&
		!errors.Is(err, store.ErrLeaseLost) && !errors.Is(err, ErrCircuitOpen)
}
