package policy

import (
	"fmt"
	"time"
)

// Defaults: what a zero field of Policy means (each field's doc states its
// default; docs/concepts.md explains each).
const (
	defaultSuccessTTL      = 24 * time.Hour
	defaultFailureTTL      = time.Hour
	defaultLeaseDuration   = 30 * time.Second
	defaultMaxAttempts     = 5
	defaultHeldKeyTimeout  = 5 * time.Second
	defaultNackDelay       = time.Second
	defaultAttemptDelay    = 3 * time.Second
	defaultMaxAttemptDelay = time.Minute
	defaultMaxResultBytes  = 1 << 20
	defaultMaxPayloadBytes = 4 << 20
)

// HeldKeyMode says what a duplicate does when another delivery holds its
// key: a live lease, or an open transaction in the one-transaction mode.
type HeldKeyMode int

const (
	// HeldKeyWait waits for the holder up to HeldKeyTimeout. When the
	// holder finishes, the duplicate replays its outcome; past the bound it
	// nacks after NackDelay. The zero value.
	HeldKeyWait HeldKeyMode = iota
	// HeldKeyNack nacks at once (after NackDelay) so the broker redelivers
	// later.
	HeldKeyNack
	// HeldKeyReject treats the duplicate as a permanent failure: it is acked
	// and not run. Use it only when the broker redelivers a message that is
	// still being processed for no reason other than a duplicate publish.
	HeldKeyReject
)

func (m HeldKeyMode) String() string {
	switch m {
	case HeldKeyWait:
		return "wait"
	case HeldKeyNack:
		return "nack"
	case HeldKeyReject:
		return "reject"
	}
	return fmt.Sprintf("HeldKeyMode(%d)", int(m))
}

// FinishedKeyMode says what a duplicate gets when its key has finished: a
// success, or a cached failure, not yet expired.
type FinishedKeyMode int

const (
	// FinishedKeyReplay replays the outcome: a success's stored produced
	// messages are returned again, so the router re-publishes what a crash
	// lost; a cached failure is acked. The zero value.
	FinishedKeyReplay FinishedKeyMode = iota
	// FinishedKeyReject treats the duplicate as a permanent failure: it is
	// acked, neither run nor replayed, and dead-lettered if a dead letter
	// is set, with an error (pipeline.ErrDuplicateRejected) that says what
	// the key holds. A redelivery whose ack was lost is rejected the same
	// way, and produced messages that a crash kept from being published are
	// never re-published: use it where a second delivery is itself an
	// error someone must look at.
	FinishedKeyReject
)

func (m FinishedKeyMode) String() string {
	switch m {
	case FinishedKeyReplay:
		return "replay"
	case FinishedKeyReject:
		return "reject"
	}
	return fmt.Sprintf("FinishedKeyMode(%d)", int(m))
}

// MissingKeyMode says what happens when the key generator finds no key
// (keygen.ErrNoKey).
type MissingKeyMode int

const (
	// MissingKeyReject acks the message as a permanent failure with a clear
	// error (and dead-letters it, if a dead letter is set). The zero value.
	MissingKeyReject MissingKeyMode = iota
	// MissingKeyRunUnguarded runs the handler without idempotency
	// protection.
	MissingKeyRunUnguarded
)

// ExhaustedMode says what happens to a message whose last attempt
// (Policy.MaxAttempts) failed retryably, when no dead letter is set. With a
// dead letter, the message is forwarded there and acked, whatever the mode.
type ExhaustedMode int

const (
	// ExhaustedKeep never acks the message: it is nacked again after
	// MaxAttemptDelay, and each later delivery runs it once more at that
	// pace, so it stays in the broker until it succeeds, the broker's own
	// limit moves it (an SQS redrive policy, a RabbitMQ quorum queue's
	// delivery limit), or an operator acts. Every such delivery is logged at
	// error level and counted. On Kafka, where a partition is processed in
	// order, it holds up the partition: the receiver refuses it there
	// without a dead letter. The zero value.
	ExhaustedKeep ExhaustedMode = iota
	// ExhaustedDrop caches the failure and acks the message, with an
	// error-level log line and a count: the message is gone. Choose it only
	// where losing a poison message is better than keeping it.
	ExhaustedDrop
)

func (m ExhaustedMode) String() string {
	switch m {
	case ExhaustedKeep:
		return "keep"
	case ExhaustedDrop:
		return "drop"
	}
	return fmt.Sprintf("ExhaustedMode(%d)", int(m))
}

func (m MissingKeyMode) String() string {
	switch m {
	case MissingKeyReject:
		return "reject"
	case MissingKeyRunUnguarded:
		return "run_unguarded"
	}
	return fmt.Sprintf("MissingKeyMode(%d)", int(m))
}

// Policy is the full set of decisions oncemill makes about a delivery.
// Every field's zero value means its default, so Policy{} is the default
// policy and a literal sets only what it changes:
//
//	policy.Policy{SuccessTTL: 7 * 24 * time.Hour}
type Policy struct {
	// SuccessTTL is how long a succeeded outcome (and its produced messages)
	// is replayed to duplicates. Set it longer than the broker's redelivery
	// horizon. Zero means 24h.
	SuccessTTL time.Duration
	// FailureTTL is how long a cached failure is remembered, and how long the
	// attempt count of a released (retryable) key survives between
	// deliveries. Zero means 1h.
	FailureTTL time.Duration
	// LeaseDuration is how long an execution owns its key without a heartbeat. A
	// worker that dies holding a lease is taken over once the lease expires.
	// Zero means 30s. The one-transaction mode has no lease.
	LeaseDuration time.Duration
	// Heartbeat is how often a running handler extends its lease. It must be
	// shorter than LeaseDuration. Zero means a third of it, which leaves
	// room for two missed beats.
	Heartbeat time.Duration
	// MaxAttempts caps executions of one key across redeliveries. When the
	// attempt that reaches the cap fails retryably, the message goes to the
	// dead letter if one is set, else as Exhausted says (under
	// NeverCacheFailures it is kept). Zero means 5.
	MaxAttempts int
	// AttemptDelay is the pause after a first attempt that failed
	// retryably, before its nack: the next attempt comes no sooner than
	// that, even from a broker that redelivers at once, on whichever
	// consumer (the store keeps the time; a claim before it is held back,
	// not an attempt). It doubles with
	// each attempt, with ±20% jitter, up to MaxAttemptDelay, so that the
	// default attempts span an outage of the handler's dependencies: 3, 6,
	// 12 and 24 s, 45 s in all (36–54 s). Zero means 3s; a negative value
	// means no pause, the broker's pace.
	AttemptDelay time.Duration
	// MaxAttemptDelay caps the pause before the nack of a retryable
	// failure (the jitter applies on top). Zero means 1m, or AttemptDelay
	// when that is longer.
	MaxAttemptDelay time.Duration
	// Exhausted is what happens, without a dead letter, to a message whose
	// attempts ran out. Zero is ExhaustedKeep: never acked.
	Exhausted ExhaustedMode
	// NeverCacheFailures, when true, caches no failure of the handler: an
	// error classified cached, and a retryable one on attempt MaxAttempts
	// or later, both give the key back and nack after the attempt's pause,
	// like a retryable failure with attempts left. Nothing is dead-lettered
	// or dropped for it; from attempt MaxAttempts on, each failure is
	// logged at error level and counted as kept, as under ExhaustedKeep.
	// The cost: a message that always fails is never acked, and comes back
	// until the broker's own limit moves it. Kafka has none: it holds up
	// its partition for good. RabbitMQ requeues it at the head of its
	// queue until a quorum queue's delivery limit moves it; a classic
	// queue never does. SQS moves it after the queue's redrive policy's
	// maxReceiveCount. Exhausted cannot be ExhaustedDrop with it.
	NeverCacheFailures bool

	// HeldKey is what a duplicate does while another delivery holds its
	// key. Zero is HeldKeyWait.
	HeldKey HeldKeyMode
	// FinishedKey is what a duplicate of a finished key (a success or a
	// cached failure) gets. Zero is FinishedKeyReplay.
	FinishedKey FinishedKeyMode
	// HeldKeyTimeout bounds how long a duplicate waits under HeldKeyWait.
	// Zero means 5s.
	HeldKeyTimeout time.Duration
	// NackDelay is slept before nacking a duplicate whose key is held, or a
	// message whose key or store failed, so that a broker that redelivers at
	// once (AMQP, Kafka's in-process resend) does not spin. Zero means 1s;
	// a negative value means no pause.
	NackDelay time.Duration

	// MissingKey is what happens when no key can be computed. Zero is
	// MissingKeyReject.
	MissingKey MissingKeyMode

	// MaxResultBytes bounds the encoded produced messages stored with a
	// success. Zero means 1 MiB.
	MaxResultBytes int
	// MaxPayloadBytes bounds the payload of an incoming message. A larger
	// message is a permanent failure, never hashed or stored. Zero means
	// 4 MiB.
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

// WithDefaults returns p with every zero field set to its default: the
// values the pipeline works with.
func (p Policy) WithDefaults() Policy {
	set := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	set(&p.SuccessTTL, defaultSuccessTTL)
	set(&p.FailureTTL, defaultFailureTTL)
	set(&p.LeaseDuration, defaultLeaseDuration)
	set(&p.Heartbeat, p.LeaseDuration/3)
	set(&p.HeldKeyTimeout, defaultHeldKeyTimeout)
	set(&p.NackDelay, defaultNackDelay)
	if p.NackDelay < 0 {
		p.NackDelay = 0
	}
	set(&p.AttemptDelay, defaultAttemptDelay)
	set(&p.MaxAttemptDelay, max(defaultMaxAttemptDelay, p.AttemptDelay))
	if p.AttemptDelay < 0 {
		p.AttemptDelay = 0
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = defaultMaxAttempts
	}
	if p.MaxResultBytes == 0 {
		p.MaxResultBytes = defaultMaxResultBytes
	}
	if p.MaxPayloadBytes == 0 {
		p.MaxPayloadBytes = defaultMaxPayloadBytes
	}
	return p
}
