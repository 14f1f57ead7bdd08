// Package policy decides what oncemill does with a delivery: how long outcomes
// are remembered, how long a lease lasts, how errors are classified, and how a
// duplicate that finds the key in progress is treated.
//
// A Policy is a plain value. Start from Default, change the fields you need,
// and let Validate tell you what is wrong:
//
//	p := policy.Default()
//	p.SuccessTTL = 7 * 24 * time.Hour
//	p.CachedErrors = []error{ErrInsufficientFunds}
//
// Classification sorts every error into Cached (stored, acked, never re-run)
// or Retryable (released, nacked, run again). Unknown errors are retryable: a
// message is never dropped because oncemill guessed.
package policy
