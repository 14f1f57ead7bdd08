package pipeline

// The metadata a dead-lettered message carries besides its own. The last
// error, and the topic, handler and subscriber it came from, are under
// Watermill's PoisonQueue keys (middleware.ReasonForPoisonedKey and the
// others), so tools written for PoisonQueue read oncemill's dead letters
// too: for DeadLetterReasonCachedFailure and
// DeadLetterReasonAttemptsExhausted the last error is the handler's, on
// the last attempt; for the other reasons, why the message was refused.
const (
	// ReasonKindKey: why, one of the DeadLetterReason values.
	ReasonKindKey = "oncemill_reason_kind"
	// AttemptKey: the attempt (Event.Attempt, in decimal) whose failure
	// was dead-lettered; "0" when the handler did not run for the
	// delivery (every reason but DeadLetterReasonCachedFailure and
	// DeadLetterReasonAttemptsExhausted).
	AttemptKey = "oncemill_attempt"
)

// DeadLetterReason is why a message is dead-lettered, one per cause. Its
// string is the dead letter's ReasonKindKey metadata and the reason
// attribute of the oncemill.dead_letters metric.
type DeadLetterReason string

const (
	// DeadLetterReasonInvalid: the validation stage refused the message.
	DeadLetterReasonInvalid DeadLetterReason = "invalid"
	// DeadLetterReasonCachedFailure: the handler failed with an error the
	// policy caches.
	DeadLetterReasonCachedFailure DeadLetterReason = "cached_failure"
	// DeadLetterReasonAttemptsExhausted: the handler failed retryably on
	// its last attempt (policy.MaxAttempts).
	DeadLetterReasonAttemptsExhausted DeadLetterReason = "attempts_exhausted"
	// DeadLetterReasonMismatch: the key is stored with another payload
	// fingerprint (ErrMismatch).
	DeadLetterReasonMismatch DeadLetterReason = "mismatch"
	// DeadLetterReasonDuplicateRejected: a duplicate under
	// policy.HeldKeyReject or policy.FinishedKeyReject
	// (ErrDuplicateRejected).
	DeadLetterReasonDuplicateRejected DeadLetterReason = "duplicate_rejected"
	// DeadLetterReasonNoKey: the message has no key (keygen.ErrNoKey),
	// under policy.MissingKeyReject.
	DeadLetterReasonNoKey DeadLetterReason = "no_key"
	// DeadLetterReasonPayloadTooLarge: the payload is larger than
	// policy.MaxPayloadBytes (ErrPayloadTooLarge).
	DeadLetterReasonPayloadTooLarge DeadLetterReason = "payload_too_large"
	// DeadLetterReasonKeyRefused: the store refuses the message's key
	// (store.ErrInvalidRequest).
	DeadLetterReasonKeyRefused DeadLetterReason = "key_refused"
	// DeadLetterReasonKeyFailed: the key generator, or the scope
	// function, failed with an error the policy caches.
	DeadLetterReasonKeyFailed DeadLetterReason = "key_failed"
)
