// Package idempotency is the idempotency stage in its two modes, Leased
// (NewLeased) and Transactional (NewTransactional): each one Watermill
// message.HandlerMiddleware that validates, computes the key, claims it,
// runs the handler through retry and the circuit breaker, and records the
// outcome, in that fixed order. Package receiver's builder fills their
// Config and is the one way users reach them; what a user names (Event,
// the errors, ClaimFromContext) lives in package pipeline.
//
// What the stage does with each answer of the store is in package
// pipeline's doc and docs/concepts.md ("What a duplicate gets").
//
// Every ConfigError the stage returns names the receiver.Builder method
// that sets the value ("WithRetry(RetryConfig.MaxTries)"), the one door
// through which a Config is filled.
package idempotency
