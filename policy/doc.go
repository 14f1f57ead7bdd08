// Package policy decides what oncemill does with a delivery: how long outcomes
// are remembered, how long a lease lasts, how errors are classified, and what
// a duplicate gets while another delivery holds its key (HeldKeyMode) or
// once it has finished (FinishedKeyMode).
//
// A Policy is a plain value whose zero fields mean their defaults, so a
// literal names only what it changes; receiver's Build says what cannot
// work:
//
//	p := policy.Policy{
//		SuccessTTL:   7 * 24 * time.Hour,
//		CachedErrors: []error{ErrInsufficientFunds},
//	}
//
// Classification sorts every error into ClassCached (stored, acked, never
// re-run) or ClassRetryable (released, nacked, run again). Unknown errors are
// retryable: a message is never dropped because oncemill guessed.
package policy
