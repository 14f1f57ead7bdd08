package pipeline

import "github.com/ThreeDotsLabs/watermill/message"

// Chain composes the stages in the one fixed order:
//
//		delivery → validation → idempotency → retry → circuit breaker → transaction → handler
//
//	  - validation first: an invalid message is never stored and never retried;
//	  - idempotency before retry: a stored outcome ends the work before any retry;
//	  - before the breaker: a stored result is replayed even while the circuit is open;
//	  - before the transaction: no transaction is opened for a duplicate;
//	  - transaction last: each retry attempt gets a fresh transaction.
//
// In the one-transaction mode (an Idempotency over a TxStore) the
// transaction is the idempotency stage's own: the chain ends each attempt's
// transaction innermost, committing the success with the record, and
// Transaction, which would open a second one, must be nil.
//
// Nil stages are left out. Telemetry, when set, wraps the whole chain in one
// span per delivery.
type Chain struct {
	Telemetry   *Telemetry
	Validation  *Validation
	Idempotency *Idempotency
	Retry       *Retry
	Breaker     *Breaker
	Transaction *Transaction
}

// Middleware is the chain as one Watermill middleware.
func (c Chain) Middleware(h message.HandlerFunc) message.HandlerFunc {
	if c.Idempotency != nil && c.Idempotency.txStore != nil {
		h = c.Idempotency.attempt(h)
	}
	if c.Transaction != nil {
		h = c.Transaction.Middleware(h)
	}
	if c.Breaker != nil {
		h = c.Breaker.Middleware(h)
	}
	if c.Retry != nil {
		h = c.Retry.Middleware(h)
	}
	if c.Idempotency != nil {
		h = c.Idempotency.Middleware(h)
	}
	if c.Validation != nil {
		h = c.Validation.Middleware(h)
	}
	if c.Telemetry != nil {
		h = c.Telemetry.Middleware(h)
	}
	return h
}
