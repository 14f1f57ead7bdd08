package idempotency

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
)

// breaker stops calling a failing dependency (sony/gobreaker/v2). It wraps
// each attempt inside the claim, so a duplicate with a stored result is
// replayed even while the circuit is open.
type breaker struct {
	cb *gobreaker.CircuitBreaker[[]*message.Message]
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
	onChange := st.OnStateChange
	st.OnStateChange = func(name string, from, to gobreaker.State) {
		tel.breakerState(name, to)
		if onChange != nil {
			onChange(name, from, to)
		}
	}
	tel.breakerState(st.Name, gobreaker.StateClosed)
	return &breaker{cb: gobreaker.NewCircuitBreaker[[]*message.Message](st)}
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
