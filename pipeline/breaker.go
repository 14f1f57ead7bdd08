package pipeline

import (
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/policy"
)

// ErrCircuitOpen is returned without calling the handler while the circuit is
// open (or half-open and at its probe limit). It is retryable: the message
// comes back after the broker's redelivery, by which time the dependency may
// have recovered.
var ErrCircuitOpen = errors.New("oncemill: circuit open")

// BreakerConfig configures the circuit breaker (sony/gobreaker/v2). Every
// zero field means its default, as in gobreaker's Settings: BreakerConfig{}
// opens after 5 consecutive retryable failures and probes with one request
// after 30s.
type BreakerConfig struct {
	// Name identifies the breaker in callbacks and metrics. Empty means
	// "oncemill".
	Name string
	// MaxRequests may pass while half-open. Zero means 1.
	MaxRequests uint32
	// Interval clears the counts while closed. Zero never clears them.
	Interval time.Duration
	// Timeout is how long the circuit stays open before probing. Zero
	// means 30s.
	Timeout time.Duration
	// ReadyToTrip decides when to open. Nil means after 5 consecutive
	// failures.
	ReadyToTrip func(gobreaker.Counts) bool
	// OnStateChange, when set, is called on every transition.
	OnStateChange func(name string, from, to gobreaker.State)
	// Classify sorts errors: only retryable failures (a dependency that is
	// down) count against the circuit; a cached failure (a business rule
	// said no) proves the dependency answered, and counts as a success. Nil
	// uses policy.Policy{}.Classify. The receiver sets it from its policy.
	Classify func(error) policy.Class
	// Telemetry records the state. Nil uses the global OpenTelemetry
	// providers. The receiver sets it.
	Telemetry *Telemetry
}

// Breaker stops calling a failing dependency. Inside the chain it sits after
// the idempotency stage, so a duplicate with a stored result is replayed even
// while the circuit is open.
type Breaker struct {
	cb *gobreaker.CircuitBreaker[[]*message.Message]
}

// NewBreaker validates cfg and returns the breaker stage.
func NewBreaker(cfg BreakerConfig) (*Breaker, error) {
	switch {
	case cfg.Timeout < 0:
		return nil, oncemill.InvalidConfig("BreakerConfig.Timeout", "%v is negative; set how long the circuit stays open, or leave it 0 for 30s", cfg.Timeout)
	case cfg.Interval < 0:
		return nil, oncemill.InvalidConfig("BreakerConfig.Interval", "%v is negative; leave it 0 to never clear the counts, or set a positive period", cfg.Interval)
	}
	if cfg.Name == "" {
		cfg.Name = "oncemill"
	}
	if cfg.MaxRequests == 0 {
		cfg.MaxRequests = 1
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.ReadyToTrip == nil {
		cfg.ReadyToTrip = func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 5 }
	}
	if cfg.Classify == nil {
		cfg.Classify = policy.Policy{}.Classify
	}
	if cfg.Telemetry == nil {
		cfg.Telemetry = defaultTelemetry()
	}
	tel, classify, onChange := cfg.Telemetry, cfg.Classify, cfg.OnStateChange
	tel.breakerState(cfg.Name, gobreaker.StateClosed)
	cb := gobreaker.NewCircuitBreaker[[]*message.Message](gobreaker.Settings{
		Name:        cfg.Name,
		MaxRequests: cfg.MaxRequests,
		Interval:    cfg.Interval,
		Timeout:     cfg.Timeout,
		ReadyToTrip: cfg.ReadyToTrip,
		IsSuccessful: func(err error) bool {
			return err == nil || classify(err) == policy.ClassCached
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			tel.breakerState(name, to)
			if onChange != nil {
				onChange(name, from, to)
			}
		},
	})
	return &Breaker{cb: cb}, nil
}

// State is the breaker's current state.
func (b *Breaker) State() gobreaker.State { return b.cb.State() }

// Counts are the breaker's request and failure counts in this generation.
func (b *Breaker) Counts() gobreaker.Counts { return b.cb.Counts() }

// Middleware is the stage as a Watermill middleware.
func (b *Breaker) Middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := b.cb.Execute(func() ([]*message.Message, error) { return h(msg) })
		if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
			return nil, fmt.Errorf("%w (%s): %w", ErrCircuitOpen, b.cb.Name(), policy.Retryable(err))
		}
		return out, err
	}
}
