package pipeline

// ReasonKindKey is the metadata key a dead-lettered message carries with the
// kind of reason: one of the DeadLetterReason values. The reason itself, the topic,
// handler and subscriber use Watermill's PoisonQueue keys
// (middleware.ReasonForPoisonedKey and the others), so tools written for
// PoisonQueue read oncemill's dead letters too.
const ReasonKindKey = "oncemill_reason_kind"

// DeadLetterReason is why a message is dead-lettered. Its string is the
// dead letter's ReasonKindKey metadata and the reason attribute of the
// oncemill.dead_letters metric.
type DeadLetterReason string

const (
	// DeadLetterReasonInvalid: the validation stage refused the message.
	DeadLetterReasonInvalid DeadLetterReason = "invalid"
	// DeadLetterReasonCachedFailure: the handler's failure is cached
	// (a permanent error, or the last attempt used).
	DeadLetterReasonCachedFailure DeadLetterReason = "cached_failure"
	// DeadLetterReasonMismatch: the key is stored with another payload
	// fingerprint.
	DeadLetterReasonMismatch DeadLetterReason = "mismatch"
	// DeadLetterReasonRejected: the message is refused before it runs (no
	// key, payload too large, a key the store refuses, a duplicate under
	// policy.HeldKeyReject or policy.FinishedKeyReject).
	DeadLetterReasonRejected DeadLetterReason = "rejected"
)
