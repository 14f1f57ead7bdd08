package pipeline

import (
	"fmt"
	"strings"
	"time"

	"github.com/oncemill/oncemill/store"
)

// DuplicateError is the error of a duplicate that is neither run nor
// replayed: ErrKeyHeld (nacked) or ErrDuplicateRejected (acked, in
// Event.Err). It says what the store holds for the key, so that a reader
// can tell a slow holder from a stuck one, or a redelivery from a key
// reused: find it with errors.As; errors.Is finds the sentinel in Err.
//
// Times are read by the local clock against the store's (Record.UpdatedAt,
// Record.LeaseExpiresAt): for information, off by the skew between them.
type DuplicateError struct {
	Scope, Key string
	// Status is the existing record's: store.StatusInProgress for a held
	// key, StatusSucceeded or StatusCachedFailure for a finished one.
	Status store.Status
	// Attempt is the record's attempt number; zero when the store did not
	// say (a key held by another transaction in the one-transaction mode,
	// whose uncommitted record no one else can read).
	Attempt int
	// Age is how long ago the store last wrote the record: its outcome,
	// or the holder's claim or last heartbeat. Zero when the store did not
	// say.
	Age time.Duration
	// LeaseLeft is how long the holder's lease has left (the lease mode's
	// Record.LeaseExpiresAt); zero for a finished key, and in the
	// one-transaction mode, whose claim lasts as long as its transaction.
	LeaseLeft time.Duration
	// Waited is how long this delivery waited for the holder
	// (policy.HeldKeyWait, and the claim's wait in the one-transaction
	// mode): for a key held by another transaction, the only time known.
	Waited time.Duration
	// Err is ErrKeyHeld or ErrDuplicateRejected.
	Err error
}

func (e *DuplicateError) Error() string {
	var b strings.Builder
	if e.Err != nil {
		b.WriteString(e.Err.Error())
	} else {
		b.WriteString("oncemill: duplicate")
	}
	fmt.Fprintf(&b, ": scope %q key %q: %s", e.Scope, e.Key, e.Status)
	if e.Attempt > 0 {
		fmt.Fprintf(&b, ", attempt %d", e.Attempt)
	}
	if e.Age != 0 {
		fmt.Fprintf(&b, ", written %v ago", e.Age.Round(time.Millisecond))
	}
	if e.LeaseLeft != 0 {
		fmt.Fprintf(&b, ", lease %v left", e.LeaseLeft.Round(time.Millisecond))
	}
	if e.Waited != 0 {
		fmt.Fprintf(&b, ", waited %v", e.Waited.Round(time.Millisecond))
	}
	return b.String()
}

// Unwrap returns the sentinel, ErrKeyHeld or ErrDuplicateRejected.
func (e *DuplicateError) Unwrap() error { return e.Err }
