package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/cenkalti/backoff/v5"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// retryDefaults fills c's zero fields with their defaults.
func retryDefaults(c pipeline.RetryConfig) pipeline.RetryConfig {
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
	return c
}

// retrier retries retryable failures in process, before the broker
// redelivers. It stops at the first success, at a cached failure, at a lost
// lease, at an open circuit (the breaker's pause is longer than any retry
// schedule; the broker's redelivery is the better wait), when the message's
// context ends, or when the schedule runs out; the last error then goes back
// to the idempotency stage, which classifies it. In the lease mode the
// lease's heartbeat keeps running while it waits.
type retrier struct {
	cfg      pipeline.RetryConfig
	classify func(error) policy.Class
	tel      *telemetry
}

func newRetrier(cfg pipeline.RetryConfig, classify func(error) policy.Class, tel *telemetry) (*retrier, error) {
	bad := func(field, format string, args ...any) (*retrier, error) {
		return nil, configerr.New("WithRetry(RetryConfig."+field+")", format, args...)
	}
	cfg = retryDefaults(cfg)
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
	return &retrier{cfg: cfg, classify: classify, tel: tel}, nil
}

// run calls attempt until it succeeds or may not be retried. A nil retrier
// calls it once.
func (r *retrier) run(ctx context.Context, attempt func() ([]*message.Message, error)) ([]*message.Message, error) {
	out, err := attempt()
	if err == nil || r == nil || !r.retryable(err) || r.cfg.MaxTries == 1 {
		return out, err
	}
	return r.retry(ctx, attempt, err)
}

// retry is the slow path, after a first retryable failure.
func (r *retrier) retry(ctx context.Context, attempt func() ([]*message.Message, error), err error) ([]*message.Message, error) {
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
		r.tel.retried(ctx)
		if serr := sleep(ctx, wait); serr != nil {
			return nil, fmt.Errorf("oncemill: retry stopped after %d tries (%w): %w", try, serr, err)
		}
		out, rerr := attempt()
		if errors.Is(rerr, pipeline.ErrCircuitOpen) {
			// The handler ran and failed in this delivery: that attempt
			// counts, and its error is the one to classify.
			return nil, fmt.Errorf("oncemill: the circuit opened after %d tries: %w", try, err)
		}
		if err = rerr; err == nil || !r.retryable(err) {
			return out, err
		}
	}
}

// retryable: the policy says so, the lease is still ours (a lost lease
// means another delivery owns the key now), and the circuit is not open.
func (r *retrier) retryable(err error) bool {
	return r.classify(err) == policy.ClassRetryable &&
		!errors.Is(err, store.ErrLeaseLost) && !errors.Is(err, pipeline.ErrCircuitOpen)
}
