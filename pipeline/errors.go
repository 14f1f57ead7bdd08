package pipeline

import "errors"

// Errors the idempotency stage reports. Cached ones are acked and carried
// in Event.Err; ErrKeyHeld and ErrCircuitOpen go back to the router, which
// nacks. A duplicate's (ErrKeyHeld, ErrDuplicateRejected) comes as a
// *DuplicateError, which says what the store holds for the key.
var (
	// ErrKeyHeld: another delivery holds the key past the wait bound.
	ErrKeyHeld = errors.New("oncemill: key is held by another delivery")
	// ErrMismatch: the key is known with a different payload.
	ErrMismatch = errors.New("oncemill: key reused with a different payload")
	// ErrPayloadTooLarge: the payload is over policy.MaxPayloadBytes.
	ErrPayloadTooLarge = errors.New("oncemill: payload too large")
	// ErrDuplicateRejected: a duplicate whose key is held, under
	// policy.HeldKeyReject, or finished, under policy.FinishedKeyReject.
	ErrDuplicateRejected = errors.New("oncemill: duplicate rejected")
	// ErrInvalidMessage wraps the validation stage's reason for refusing a message.
	ErrInvalidMessage = errors.New("oncemill: invalid message")
	// ErrCircuitOpen is returned without calling the handler while the
	// circuit is open (or half-open and at its probe limit). It is
	// retryable: the message comes back after the broker's redelivery, by
	// which time the dependency may have recovered.
	ErrCircuitOpen = errors.New("oncemill: circuit open")
)
