package pipeline

import "github.com/oncemill/oncemill/store"

// Outcome is what the idempotency stage did with one delivery.
type Outcome int

const (
	// Executed: the handler ran and succeeded; the result is stored. Acked.
	OutcomeExecuted Outcome = iota + 1
	// Replayed: a duplicate of a success; the stored messages were returned. Acked.
	OutcomeReplayed
	// FailureCached: the handler failed permanently, or ran out of attempts
	// and was dead-lettered or dropped (Event.Exhausted); the failure is
	// stored. Acked.
	OutcomeCachedFailure
	// FailureReplayed: a duplicate of a cached failure; not run. Acked.
	OutcomeCachedFailureReplayed
	// Released: the handler failed retryably; the key was released, and the
	// message is nacked after the attempt's pause (policy.AttemptDelay).
	// Nacked.
	OutcomeReleased
	// HeldKeyNacked: another delivery held the key past the wait. Nacked.
	OutcomeHeldKeyNacked
	// Rejected: a permanent failure before the handler could run (no key,
	// mismatch, payload too large, a duplicate of a held key under policy.HeldKeyReject
	// or of a finished one under policy.FinishedKeyReject). Acked.
	OutcomeRejected
	// Unguarded: no key could be computed and the policy said to run anyway.
	OutcomeUnguarded
	// StoreFailed: the store could not decide. Nacked, so nothing is lost.
	OutcomeStoreFailed
	// Invalid: the validation stage refused the message. Acked.
	OutcomeInvalid
	// KeyFailed: the key generator failed with an error the policy retries
	// (a lookup service down), not for want of a key. Nacked after
	// policy.NackDelay, so the message comes back.
	OutcomeKeyFailed
	// HeldBack: not an attempt, and counted against nothing. The delivery
	// came before the key's next attempt may start (the pause after a
	// retryable failure, which the store keeps), or the circuit breaker
	// refused it. Nacked after the time left.
	OutcomeHeldBack
)

func (o Outcome) String() string {
	switch o {
	case OutcomeExecuted:
		return "executed"
	case OutcomeReplayed:
		return "replayed"
	case OutcomeCachedFailure:
		return "cached_failure"
	case OutcomeCachedFailureReplayed:
		return "cached_failure_replayed"
	case OutcomeReleased:
		return "released"
	case OutcomeHeldKeyNacked:
		return "held_key_nacked"
	case OutcomeRejected:
		return "rejected"
	case OutcomeUnguarded:
		return "unguarded"
	case OutcomeStoreFailed:
		return "store_failed"
	case OutcomeInvalid:
		return "invalid"
	case OutcomeKeyFailed:
		return "key_failed"
	case OutcomeHeldBack:
		return "held_back"
	}
	return "unknown"
}

// Acked reports whether the delivery is acknowledged with this outcome.
func (o Outcome) Acked() bool {
	switch o {
	case OutcomeReleased, OutcomeHeldKeyNacked, OutcomeStoreFailed, OutcomeKeyFailed, OutcomeHeldBack:
		return false
	}
	return true
}

// Event describes one delivery after the idempotency stage decided on it.
type Event struct {
	MessageUUID string
	Scope       string
	Key         string
	Outcome     Outcome
	// Decision is the store's last decision; zero when the store was not reached.
	Decision store.Decision
	// Attempt and Token describe the lease for executed deliveries.
	Attempt  int
	Token    int64
	Takeover bool
	// Contended is true when a ClaimLease of this delivery found the key held by
	// another running delivery (store.DecisionHeld), whatever came of it: a
	// wait that ended in a replay or an execution, or a nack. In the
	// one-transaction mode it comes from store.ClaimResult.Contended: a wait
	// that ended in an execution (the holder rolled back) is not seen in the
	// key mode; the watermark mode sees it (the partition row's lock), and
	// sets it too when its fast path's commit found the watermark moved
	// and the delivery was claimed again.
	Contended bool
	// Exhausted is true when the handler failed retryably (under
	// policy.NeverCacheFailures, in any way) on an attempt at or past
	// policy.MaxAttempts: the message was dead-lettered, dropped
	// (policy.ExhaustedDrop; Outcome FailureCached) or kept (nacked; Outcome
	// Released).
	Exhausted bool
	// Err is the handler's error, or why the delivery was rejected.
	Err error
	// Shadow is true when the stage, in shadow mode (receiver's
	// WithShadow), ran the handler unguarded where enforcement would not
	// have run it, or nacked an execution's failure that enforcement would
	// have acked: Outcome is then what enforcement would have done (Replayed,
	// CachedFailureReplayed, HeldKeyNacked, Rejected, StoreFailed,
	// KeyFailed, CachedFailure), not what the router was told, and Err is
	// the handler's error. The delivery was acked if and only if Err is nil.
	Shadow bool
}
