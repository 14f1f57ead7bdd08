package policy

import (
	"errors"
	"fmt"
	"time"
)

// Defaults (docs/concepts.md explains each).
const (
	DefaultSuccessTTL      = 24 * time.Hour
	DefaultFailureTTL      = time.Hour
	DefaultLease           = 30 * time.Second
	DefaultHeartbeat       = DefaultLease / 3
	DefaultMaxAttempts     = 5
	DefaultInProgressWait  = 5 * time.Second
	DefaultNackDelay       = time.Second
	DefaultMaxResultBytes  = 1 << 20
	DefaultMaxPayloadBytes = 4 << 20
)

// InProgressMode says what a duplicate does when another live lease holds its key.
type InProgressMode int

const (
	// Wait polls the record for up to InProgressWait. When the holder finishes,
	// the duplicate replays its outcome; past the bound it nacks after NackDelay.
	Wait InProgressMode = iota
	// Nack nacks at once (after NackDelay) so the broker redelivers later.
	Nack
	// Reject treats the duplicate as a permanent failure: it is acked and not run.
	// Use it only when the broker redelivers a message that is still being
	// processed for no reason other than a duplicate publish.
	Reject
)

func (m InProgressMode) String() string {
	switch m {
	case Wait:
		return "wait"
	case Nack:
		return "nack"
	case Reject:
		return "reject"
	}
	return fmt.Sprintf("InProgressMode(%d)", int(m))
}

// MissingKeyMode says what happens when the key generator cannot compute a key.
type MissingKeyMode int

const (
	// FailMissingKey acks the message as a permanent failure with a clear error.
	FailMissingKey MissingKeyMode = iota
	// ExecuteUnguarded runs the handler without idempotency protection.
	ExecuteUnguarded
)

// Policy is the full set of decisions oncemill makes about a delivery.
// The zero value is not valid; start from Default.
type Policy struct {
	// SuccessTTL is how long a succeeded outcome (and its produced messages)
	// is replayed to duplicates. Set it longer than the broker's redelivery horizon.
	SuccessTTL time.Duration
	// FailureTTL is how long a cached failure is remembered, and how long the
	// attempt count of a released (retryable) key survives between deliveries.
	FailureTTL time.Duration
	// Lease is how long an execution owns its key without a heartbeat. A worker
	// that dies holding a lease is taken over once the lease expires.
	Lease time.Duration
	// Heartbeat is how often a running handler extends its lease. It must be
	// shorter than Lease; a third of it leaves room for two missed beats.
	Heartbeat time.Duration
	// MaxAttempts caps executions of one key across redeliveries. When the
	// attempt that reaches the cap fails retryably, the failure is cached.
	MaxAttempts int

	// InProgress is what a duplicate does while another lease holds its key.
	InProgress InProgressMode
	// InProgressWait bounds how long a duplicate waits in Wait mode.
	InProgressWait time.Duration
	// NackDelay is slept before nacking an in-progress duplicate, so that a
	// broker that redelivers at once (AMQP, Kafka's in-process resend) does not spin.
	NackDelay time.Duration

	// MissingKey is what happens when no key can be computed.
	MissingKey MissingKeyMode

	// MaxResultBytes bounds the encoded produced messages stored with a success.
	MaxResultBytes int
	// MaxPayloadBytes bounds the payload of an incoming message. A larger
	// message is a permanent failure, never hashed or stored.
	MaxPayloadBytes int

	// CachedErrors are matched with errors.Is: a match is a cached failure.
	CachedErrors []error
	// RetryableErrors are matched with errors.Is: a match is retryable even if
	// it also matches CachedErrors.
	RetryableErrors []error
	// Classifier, when set, is asked first. Returning ok=false falls through
	// to the markers and the error lists.
	Classifier func(err error) (c Class, ok bool)
}

// Default returns the default policy: success remembered 24h, cached
// failures 1h, a 30s lease extended every 10s, 5 attempts, in-progress
// duplicates wait 5s and then nack after 1s.
func Default() Policy {
	return Policy{
		SuccessTTL:      DefaultSuccessTTL,
		FailureTTL:      DefaultFailureTTL,
		Lease:           DefaultLease,
		Heartbeat:       DefaultHeartbeat,
		MaxAttempts:     DefaultMaxAttempts,
		InProgress:      Wait,
		InProgressWait:  DefaultInProgressWait,
		NackDelay:       DefaultNackDelay,
		MissingKey:      FailMissingKey,
		MaxResultBytes:  DefaultMaxResultBytes,
		MaxPayloadBytes: DefaultMaxPayloadBytes,
	}
}

// ErrInvalid is wrapped by every error Validate returns.
var ErrInvalid = errors.New("invalid policy")

// Validate reports the first setting that cannot work, saying what to change.
func (p Policy) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
	}
	switch {
	case p.SuccessTTL <= 0:
		return bad("SuccessTTL is %v; set it above zero and longer than the broker's redelivery horizon (default %v)", p.SuccessTTL, DefaultSuccessTTL)
	case p.FailureTTL <= 0:
		return bad("FailureTTL is %v; set it above zero (default %v)", p.FailureTTL, DefaultFailureTTL)
	case p.Lease <= 0:
		return bad("Lease is %v; set it above zero (default %v)", p.Lease, DefaultLease)
	case p.Heartbeat <= 0:
		return bad("Heartbeat is %v; set it above zero and below Lease (%v), e.g. Lease/3", p.Heartbeat, p.Lease)
	case p.Heartbeat >= p.Lease:
		return bad("Heartbeat %v is not shorter than Lease %v; the lease would expire between beats: use at most Lease/2, e.g. %v", p.Heartbeat, p.Lease, p.Lease/3)
	case p.MaxAttempts < 1:
		return bad("MaxAttempts is %d; set it to 1 or more (default %d)", p.MaxAttempts, DefaultMaxAttempts)
	case p.InProgress < Wait || p.InProgress > Reject:
		return bad("InProgress is %v; use policy.Wait, policy.Nack or policy.Reject", p.InProgress)
	case p.InProgress == Wait && p.InProgressWait <= 0:
		return bad("InProgressWait is %v with InProgress=wait; set a bound above zero (default %v) or use policy.Nack", p.InProgressWait, DefaultInProgressWait)
	case p.NackDelay < 0:
		return bad("NackDelay is %v; set it to zero or more", p.NackDelay)
	case p.MissingKey != FailMissingKey && p.MissingKey != ExecuteUnguarded:
		return bad("MissingKey is %d; use policy.FailMissingKey or policy.ExecuteUnguarded", p.MissingKey)
	case p.MaxResultBytes <= 0:
		return bad("MaxResultBytes is %d; set it above zero (default %d)", p.MaxResultBytes, DefaultMaxResultBytes)
	case p.MaxPayloadBytes <= 0:
		return bad("MaxPayloadBytes is %d; set it above zero (default %d)", p.MaxPayloadBytes, DefaultMaxPayloadBytes)
	}
	return nil
}
