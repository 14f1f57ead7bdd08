package idempotency

import (
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
)

// breaker stops calling a failing dependency (sony/gobreaker/v2). It wraps
// each attempt inside the claim, so a duplicate with a stored result is
// replayed even while the circuit is open.
type breaker struct {
	cb       *gobreaker.CircuitBreaker[[]*message.Message]
	openTime time.Duration // gobreaker.Settings.Timeout, its default filled in
	// openUntil is when the open state ends, in Unix nanoseconds; gobreaker
	// does not say, so it is noted at each change to open.
	openUntil atomic.Int64
}

// newBreaker takes gobreaker's own settings; what it leaves nil, oncemill
// supplies: IsSuccessful from classify (a cached failure proves the
// dependency answered), and the name "oncemill". The state goes to tel
// besides st.OnStateChange.
func newBreaker(st gobreaker.Settings, classify func(error) policy.Class, tel *telemetry) *breaker {
	if st.Name == "" {
		st.Name = "oncemill"
	}
	if st.IsSuccessful == nil {
		st.IsSuccessful = func(err error) bool { return err == nil || classify(err) == policy.ClassCached }
	}
	b := &breaker{openTime: st.Timeout}
	if b.openTime <= 0 {
		b.openTime = defaultBreakerOpenTime
	}
	onChange := st.OnStateChange
	st.OnStateChange = func(name string, from, to gobreaker.State) {
		if to == gobreaker.StateOpen {
			b.openUntil.Store(time.Now().Add(b.openTime).UnixNano())
		}
		tel.breakerState(name, to)
		if onChange != nil {
			onChange(name, from, to)
		}
	}
	tel.breakerState(st.Name, gobreaker.StateClosed)
	b.cb = gobreaker.NewCircuitBreaker[[]*message.Message](st)
	return b
}

// defaultBreakerOpenTime is gobreaker's open state when Settings.Timeout
// is not set.
const defaultBreakerOpenTime = 60 * time.Second

// openFor is how long the circuit stays open yet; zero when it is not
// open (a half-open circuit at its probe limit lets a call through as soon
// as a probe ends).
func (b *breaker) openFor() time.Duration {
	if b == nil || b.cb.State() != gobreaker.StateOpen {
		return 0
	}
	return max(time.Until(time.Unix(0, b.openUntil.Load())), 0)
}

// wrap runs h through the circuit. A nil breaker is no circuit.
func (b *breaker) wrap(h message.HandlerFunc) message.HandlerFunc {
	if b == nil {
		return h
	}
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := b.cb.Execute(func() ([]*message.Message, error) { return h(msg) })
		if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
			return nil, fmt.Errorf("%w (%s): %w", pipeline.ErrCircuitOpen, b.cb.Name(), policy.Retryable(err))
		}
		return out, err
	}
}
