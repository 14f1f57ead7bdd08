// Package claimctx holds the context keys by which a handler's context
// carries its claim. The idempotency stage sets them; package pipeline reads
// them (ClaimFromContext, CheckLease), so neither imports the other.
package claimctx

import "context"

// ClaimKey's value is the *store.Claim the handler runs under, in either
// mode.
type ClaimKey struct{}

// LeaseKey's value is the Lease of a handler that runs in the lease mode.
type LeaseKey struct{}

// Lease is the lease a handler runs under in the lease mode.
type Lease interface {
	// Check confirms with one store round trip that the lease is still
	// held, and extends it; an error wrapping store.ErrLeaseLost when it
	// is gone.
	Check(ctx context.Context) error
}
