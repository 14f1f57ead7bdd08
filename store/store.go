package store

import (
	"context"
	"errors"
	"time"
)

// Store remembers the outcome of each (scope, key). Implementations are safe
// for concurrent use by many goroutines and, for shared stores, many processes.
type Store interface {
	// Begin atomically decides what this delivery does. With Execute the
	// returned Lease is held until Complete, Release or its expiry.
	Begin(ctx context.Context, req BeginRequest) (BeginResult, error)
	// Complete stores a final outcome. ErrLeaseLost if the lease is not current.
	Complete(ctx context.Context, lease Lease, out Outcome) error
	// Release gives the key back after a retryable failure. The record keeps
	// its attempt count for keep, so attempts are counted across deliveries.
	// With keep <= 0 the record is removed (the key is absent again).
	// ErrLeaseLost if the lease is not current.
	Release(ctx context.Context, lease Lease, keep time.Duration) error
	// Extend pushes the lease expiry to now+d and returns the updated lease.
	// ErrLeaseLost if the lease is not current or has already expired.
	// ErrInvalidRequest if d is not positive.
	Extend(ctx context.Context, lease Lease, d time.Duration) (Lease, error)
	// Get returns the unexpired record of (scope, key), or ErrNotFound.
	// An in-progress record whose lease has expired counts as expired.
	Get(ctx context.Context, scope, key string) (Record, error)
	// Delete removes the record of (scope, key), whatever its state. It is
	// for operators; deleting a live lease lets a duplicate run again.
	Delete(ctx context.Context, scope, key string) error
	// DeleteExpired removes up to limit expired records and returns how many
	// it removed. Expired records are already invisible; this frees space.
	// Expired leases are removed too, after which the next Begin of their
	// key starts again at attempt 1. ErrInvalidRequest if limit is not
	// positive.
	DeleteExpired(ctx context.Context, limit int) (int, error)
}

// KeyLimiter is implemented by stores that bound the length of a key.
// Longer keys are hashed by the caller, never truncated.
type KeyLimiter interface {
	MaxKeyLen() int
}

// TxCompleter is implemented by stores that can write the final outcome
// inside the caller's own transaction: the one the store's transaction
// manager began and put into ctx for the handler. The business writes and
// the "processed" record then commit together or not at all.
//
// CompleteInTx follows the rules of Complete (ErrLeaseLost when the lease is
// not current, changing nothing), but its write only takes effect if the
// transaction commits. When ctx carries no transaction of this store it
// returns an error wrapping ErrNoTransaction.
type TxCompleter interface {
	CompleteInTx(ctx context.Context, lease Lease, out Outcome) error
}

// Sentinel errors. Implementations wrap them with %w and context.
var (
	// ErrLeaseLost: the caller's fencing token is no longer current (the lease
	// expired and was taken over, or the record finished or was deleted).
	ErrLeaseLost = errors.New("store: lease lost")
	// ErrNotFound: no unexpired record for the key.
	ErrNotFound = errors.New("store: record not found")
	// ErrInvalidRequest: the request cannot be served as given.
	ErrInvalidRequest = errors.New("store: invalid request")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store: closed")
	// ErrNoTransaction: CompleteInTx found no transaction of the store in ctx.
	ErrNoTransaction = errors.New("store: no transaction in context")
)

// Decision is what Begin tells the caller to do.
type Decision int

const (
	// Execute: this delivery owns the key; run the handler under the lease.
	Execute Decision = iota + 1
	// Replay: the key finished (Succeeded or Failed) and has not expired.
	Replay
	// InProgress: another live lease holds the key.
	InProgress
	// Mismatch: the key is known with a different payload fingerprint.
	Mismatch
)

func (d Decision) String() string {
	switch d {
	case Execute:
		return "execute"
	case Replay:
		return "replay"
	case InProgress:
		return "in_progress"
	case Mismatch:
		return "mismatch"
	}
	return "unknown"
}

// Status is the state of a record.
type Status int

const (
	StatusInProgress Status = iota + 1
	StatusSucceeded
	StatusFailed
	StatusRetryable
)

func (s Status) String() string {
	switch s {
	case StatusInProgress:
		return "in_progress"
	case StatusSucceeded:
		return "succeeded"
	case StatusFailed:
		return "failed"
	case StatusRetryable:
		return "retryable"
	}
	return "unknown"
}

// BeginRequest asks for the key.
type BeginRequest struct {
	Scope string
	Key   string
	// Fingerprint identifies the payload. When both it and the stored one are
	// non-empty and differ, Begin returns Mismatch.
	Fingerprint string
	// Lease is how long the lease lasts without Extend. Must be positive.
	Lease time.Duration
}

// Validate reports a request no store can serve.
func (r BeginRequest) Validate() error {
	if r.Key == "" {
		return errors.Join(ErrInvalidRequest, errors.New("empty key"))
	}
	if r.Lease <= 0 {
		return errors.Join(ErrInvalidRequest, errors.New("lease must be positive"))
	}
	return nil
}

// BeginResult is Begin's answer.
type BeginResult struct {
	Decision Decision
	// Lease is set for Execute.
	Lease Lease
	// Takeover is true for Execute when an expired lease of another worker
	// was taken over.
	Takeover bool
	// Record is the existing record for Replay, InProgress and Mismatch, and
	// nil for Execute.
	Record *Record
}

// Lease is the right to finish one execution of a key.
type Lease struct {
	Scope string
	Key   string
	// Token is the fencing token. It rises on every Begin that executes the
	// key, so a newer attempt always holds a larger token than a stale one.
	Token int64
	// Attempt counts executions of the key across deliveries, from 1.
	Attempt int
	// ExpiresAt is the lease expiry by the store's clock, for information:
	// callers must not compare it with their own clock to decide anything.
	ExpiresAt time.Time
}

// Outcome is what Complete stores.
type Outcome struct {
	// Status is StatusSucceeded or StatusFailed.
	Status Status
	// Result is the encoded result of a success.
	Result []byte
	// ErrorKind and ErrorMessage describe a cached failure.
	ErrorKind    string
	ErrorMessage string
	// TTL is how long the outcome is replayed. Must be positive.
	TTL time.Duration
}

// Validate reports an outcome no store can serve.
func (o Outcome) Validate() error {
	if o.Status != StatusSucceeded && o.Status != StatusFailed {
		return errors.Join(ErrInvalidRequest, errors.New("outcome status must be succeeded or failed, not "+o.Status.String()))
	}
	if o.TTL <= 0 {
		return errors.Join(ErrInvalidRequest, errors.New("outcome TTL must be positive"))
	}
	return nil
}

// Record is the stored state of one key.
type Record struct {
	Scope       string
	Key         string
	Fingerprint string
	Status      Status
	Token       int64
	Attempt     int
	// LeaseExpiresAt is set while Status is StatusInProgress.
	LeaseExpiresAt time.Time
	Result         []byte
	ErrorKind      string
	ErrorMessage   string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	// ExpiresAt is when the record stops being visible. For an in-progress
	// record it equals LeaseExpiresAt.
	ExpiresAt time.Time
}
