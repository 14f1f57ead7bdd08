package pipeline

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"

	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// RetryConfig configures in-process retries. The schedule is
// cenkalti/backoff/v5's exponential backoff.
type RetryConfig struct {
	InitialInterval     time.Duration
	Multiplier          float64
	MaxInterval         time.Duration
	RandomizationFactor float64 // jitter: each wait is ±this fraction
	// MaxElapsedTime bounds the time spent retrying one delivery.
	MaxElapsedTime time.Duration
	// MaxTries counts the first try; 1 disables retrying.
	MaxTries int
	// Policy classifies errors: only retryable ones are retried.
	Policy policy.Policy
	// OnRetry is called before each wait.
	OnRetry   func(try int, err error, wait time.Duration)
	Telemetry *Telemetry
}

// DefaultRetryConfig: 3 tries, waits from 100 ms doubling to at most 2 s with
// ±50% jitter, at most 10 s in all.
func DefaultRetryConfig() RetryConfig {
	return RetryConfig{
		InitialInterval:     100 * time.Millisecond,
		Multiplier:          2,
		MaxInterval:         2 * time.Second,
		RandomizationFactor: 0.5,
		MaxElapsedTime:      10 * time.Second,
		MaxTries:            3,
		Policy:              policy.Default(),
	}
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
	bad := func(format string, args ...any) (*Retry, error) {
		return nil, fmt.Errorf("%w: retry: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	switch {
	case cfg.InitialInterval <= 0:
		return bad("InitialInterval is %v; set it above zero (default 100ms)", cfg.InitialInterval)
	case cfg.Multiplier < 1:
		return bad("Multiplier is %v; set it to 1 or more (default 2)", cfg.Multiplier)
	case cfg.MaxInterval < cfg.InitialInterval:
		return bad("MaxInterval %v is below InitialInterval %v; raise it", cfg.MaxInterval, cfg.InitialInterval)
	case cfg.RandomizationFactor < 0 || cfg.RandomizationFactor >= 1:
		return bad("RandomizationFactor is %v; use a value in [0, 1) (default 0.5)", cfg.RandomizationFactor)
	case cfg.MaxElapsedTime <= 0:
		return bad("MaxElapsedTime is %v; set it above zero (default 10s)", cfg.MaxElapsedTime)
	case cfg.MaxTries < 1:
		return bad("MaxTries is %d; set it to 1 or more (1 disables retrying; default 3)", cfg.MaxTries)
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("%w: retry: %w", ErrInvalidConfig, err)
	}
	if cfg.Telemetry == nil {
		cfg.Telemetry = defaultTelemetry()
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
	return r.cfg.Policy.Classify(err) == policy.Retryable &&
		!errors.Is(err, store.ErrLeaseLost) && !errors.Is(err, ErrCircuitOpen)
}
