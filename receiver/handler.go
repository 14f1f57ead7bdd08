package receiver

import (
	"context"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// What a handler and its wiring need, under one import. These are the
// other packages' own types and functions, not copies: a receiver.Event is
// a pipeline.Event.

type (
	// Policy is policy.Policy: TTLs, the lease, attempts and error
	// classification (WithPolicy).
	Policy = policy.Policy
	// Event is pipeline.Event: what oncemill decided for one delivery
	// (WithEventHandler).
	Event = pipeline.Event
	// Outcome is pipeline.Outcome: what the idempotency stage did with a
	// delivery.
	Outcome = pipeline.Outcome
	// Lease is store.Claim: the handler's fencing token and attempt
	// (ClaimFromContext).
	Lease = store.Claim
)

// The outcomes of pipeline.Outcome.
const (
	OutcomeExecuted        = pipeline.OutcomeExecuted
	OutcomeReplayed        = pipeline.OutcomeReplayed
	OutcomeFailureCached   = pipeline.OutcomeCachedFailure
	OutcomeFailureReplayed = pipeline.OutcomeCachedFailureReplayed
	OutcomeReleased        = pipeline.OutcomeReleased
	OutcomeHeldKeyNacked   = pipeline.OutcomeHeldKeyNacked
	OutcomeRejected        = pipeline.OutcomeRejected
	OutcomeUnguarded       = pipeline.OutcomeUnguarded
	OutcomeStoreFailed     = pipeline.OutcomeStoreFailed
	OutcomeInvalid         = pipeline.OutcomeInvalid
	OutcomeKeyFailed       = pipeline.OutcomeKeyFailed
)

// ErrInvalidConfig is oncemill.ErrInvalidConfig: every error of Build wraps
// it.
var ErrInvalidConfig = oncemill.ErrInvalidConfig

// Permanent marks err as a failure to cache: stored, acked, never run
// again (policy.Cached).
func Permanent(err error) error { return policy.Cached(err) }

// Transient marks err as retryable even when the policy would cache it
// (policy.Retryable).
func Transient(err error) error { return policy.Retryable(err) }

// ClaimFromContext returns the lease the handler runs under: its fencing
// token and attempt (pipeline.ClaimFromContext).
func LeaseFromContext(ctx context.Context) (Lease, bool) { return pipeline.ClaimFromContext(ctx) }

// CheckLease confirms that the handler still holds its lease, right before
// a side effect outside any transaction (pipeline.CheckLease).
func CheckLease(ctx context.Context) error { return pipeline.CheckLease(ctx) }
