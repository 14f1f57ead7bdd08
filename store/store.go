package store

import (
	"context"
	"errors"
	"time"
)

// Store is what the idempotency stage needs in the lease mode: it
// remembers the outcome of each (scope, key). Implementations are safe for
// concurrent use by many goroutines and, for shared stores, many processes.
type Store interface {
	// Limits reports what the store can hold; the stage hashes longer keys
	// and refuses a policy that would store larger results.
	Limits() Limits
	// ClaimLease atomically decides what this delivery does. With
	// DecisionExecute the returned Lease is held until Complete, Release or
	// its expiry.
	ClaimLease(ctx context.Context, req LeaseRequest) (ClaimResult, error)
	// Complete stores a final outcome. ErrLeaseLost if the lease is not current.
	Complete(ctx context.Context, lease Claim, c Completion) error
	// Release gives the key back after a retryable failure (out.Status
	// StatusRetryable). The record keeps its attempt count for out.TTL, so
	// attempts are counted across deliveries; with out.TTL <= 0 it is
	// removed (the key is absent again). Until out.RetryAfter has passed,
	// by the store's clock, a claim is answered DecisionHeld with
	// ClaimResult.RetryIn: the attempt schedule's pause holds whichever
	// consumer gets the message next. ErrLeaseLost if the lease is not
	// current.
	Release(ctx context.Context, lease Claim, out Completion) error
	// Extend pushes the lease expiry to now+d and returns the updated lease.
	// ErrLeaseLost if the lease is not current or has already expired.
	// ErrInvalidRequest if d is not positive.
	Extend(ctx context.Context, lease Claim, d time.Duration) (Claim, error)
}

// Admin is what operators and maintenance need of a store, apart from the
// delivery path: every store of oncemill implements it.
type Admin interface {
	// Get returns the unexpired record of (scope, key), or ErrNotFound.
	// An in-progress record whose lease has expired counts as expired.
	Get(ctx context.Context, scope, key string) (Record, error)
	// List returns the records the store holds that match req, expired or
	// not (Record.ExpiresAt says), in (scope, key) order, a page at a time.
	List(ctx context.Context, req ListRequest) (ListPage, error)
	// Delete removes the record of (scope, key) only if its fencing token is
	// still token: what an operator inspected (Get, List) is what goes.
	// ErrLeaseLost when another delivery has taken the key since (the token
	// changed), ErrNotFound when there is no record. It is for operators;
	// deleting a live lease lets a duplicate run again.
	Delete(ctx context.Context, scope, key string, token int64) error
}

// ListRequest selects records for Admin.List. Zero fields select
// everything.
type ListRequest struct {
	// Scope, when set, selects that scope only.
	Scope string
	// Status, when set, selects that status only.
	Status Status
	// UpdatedBefore, when set, selects records last written before it (by
	// the store's clock): an in-progress record older than its handler
	// should run is stuck.
	UpdatedBefore time.Time
	// After is the Next of the previous page; empty for the first.
	After string
	// Limit bounds the page; zero means 100.
	Limit int
	// MessageUUID, when set, selects the records last claimed by the
	// message of that UUID (Record.MessageUUID). No store indexes it: every
	// store reads all records (in pages) to answer, which suits an
	// operator, not the delivery path.
	MessageUUID string
}

// ListPage is one page of Admin.List.
type ListPage struct {
	Records []Record
	// Next is the After of the next page; empty when this is the last.
	Next string
}

// Limits is what a store can hold. Zero means no bound.
type Limits struct {
	// MaxKeyLen is the longest key in bytes; the stage hashes longer keys
	// (keygen.StorableKey), never truncates them.
	MaxKeyLen int
	// MaxResultBytes bounds Completion.Result. The stage refuses a
	// policy.MaxResultBytes above it, so that produced messages too large
	// for the store are stored as omitted (the success is remembered, the
	// messages are not replayed) rather than not at all.
	MaxResultBytes int
}

// Transactional is implemented by stores that keep the record in the same
// database as the handler's business data and write it inside the
// handler's own transaction: the one-transaction mode.
//
// Claim begins a transaction whose first statement claims the key. The
// uncommitted record is the lease: a concurrent Claim of the key waits on
// it (at most ClaimRequest.Wait), then replays what the first committed, or
// takes the key when the first rolled back or its connection died. The
// record is written in its final, succeeded form by the claim, so a commit
// without produced messages writes nothing more; the business writes and
// "processed" commit together or not at all. There is no heartbeat and no
// lease expiry: the lease lasts as long as the transaction.
//
// A failed attempt rolls back, claim included. RecordRollback then records
// what the failure leaves behind, unless another delivery claimed or
// finished the key meanwhile: out.Status StatusCachedFailure caches the failure
// for out.TTL; StatusRetryable keeps the lease's attempt count for out.TTL,
// so that attempts are counted across deliveries, and holds the next claim
// back until out.RetryAfter, as Store.Release does. fingerprint is the
// claim's, kept for mismatch detection.
type Transactional interface {
	Limits() Limits
	ClaimInTx(ctx context.Context, req TxRequest) (TxResult, error)
	RecordRollback(ctx context.Context, lease Claim, fingerprint string, out Completion) error
}

// TxRequest asks for the key inside a new transaction.
type TxRequest struct {
	Scope       string
	Key         string
	Fingerprint string
	// SuccessTTL is how long a success is replayed, counted from the
	// commit. Must be positive.
	SuccessTTL time.Duration
	// Retain is how long the record is kept at least, whatever its outcome
	// (the longest of the outcome TTLs). Zero means SuccessTTL.
	Retain time.Duration
	// Wait bounds how long the claim waits for another delivery that holds
	// the key in its transaction; past it the answer is DecisionHeld. Must be
	// positive.
	Wait time.Duration
	// MessageUUID is the UUID of the message being delivered, stored in the
	// record (Record.MessageUUID) by the claim and by RecordRollback (which
	// finds it in Claim.MessageUUID).
	MessageUUID string
	// Deferrable lets the store send the claim with the handler's first
	// statement, in the transaction's first round trip, rather than decide
	// it before ClaimInTx returns. DecisionExecute is then provisional: if
	// the key turns out to be held or recorded, the handler's statements
	// fail, nothing of the transaction commits, and Commit and Rollback
	// return an error wrapping ErrLeaseLost; the caller claims again
	// without Deferrable. A store that always decides up front ignores it.
	Deferrable bool
}

// TxResult is Claim's answer. With DecisionExecute, Tx is the open
// transaction that holds the claim; for every other decision the
// transaction has already ended and Tx is nil.
type TxResult struct {
	ClaimResult
	Tx Tx
	// Contended is true when the claim met the key held by another
	// delivery's open transaction and waited for it: it then replays what
	// that one committed, or answers DecisionHeld past the wait. (A wait that
	// ends in DecisionExecute, the holder having rolled back, leaves no trace.)
	Contended bool
}

// Tx is the handler's transaction in the one-transaction mode. Exactly one
// of Commit and Rollback ends it; both release its connection.
type Tx interface {
	// Context returns ctx carrying the transaction, where the handler finds
	// it (for store/postgres: postgres.TxFromContext).
	Context(ctx context.Context) context.Context
	// Commit stores result (the encoded produced messages; nil for none)
	// with the success and commits. The success is replayed for
	// SuccessTTL from the commit. An error means the outcome is unknown or
	// rolled back: the caller treats the attempt as failed, and a later
	// Claim finds what really happened.
	Commit(ctx context.Context, result []byte) error
	// Rollback ends the transaction, claim and business writes included.
	// After a deferred claim that did not take the key
	// (TxRequest.Deferrable) it returns an error wrapping ErrLeaseLost.
	Rollback(ctx context.Context) error
}

// Sentinel errors. Implementations always wrap them with %w and context
// that starts with "oncemill: ", so their own text has no prefix.
var (
	// ErrLeaseLost: the caller's fencing token is no longer current (the lease
	// expired and was taken over, or the record finished or was deleted).
	ErrLeaseLost = errors.New("lease lost")
	// ErrNotFound: no unexpired record for the key.
	ErrNotFound = errors.New("record not found")
	// ErrInvalidRequest: the request cannot be served as given.
	ErrInvalidRequest = errors.New("invalid store request")
	// ErrClosed: the store was closed.
	ErrClosed = errors.New("store closed")
)

// MaxScopeLen is the longest scope in bytes that every store holds. The
// idempotency stage refuses a longer configured scope, and hashes a longer
// handler name (keygen.StorableKey) before it uses it as the scope.
const MaxScopeLen = 1024

// Decision is what ClaimLease tells the caller to do.
type Decision int

const (
	// DecisionExecute: this delivery owns the key; run the handler under
	// the lease.
	DecisionExecute Decision = iota + 1
	// DecisionReplay: the key finished (succeeded or failed) and has not
	// expired.
	DecisionReplay
	// DecisionHeld: another delivery holds the key (a live lease, or an
	// open transaction in the one-transaction mode), or a retryable failure
	// holds its next attempt back (ClaimResult.RetryIn).
	DecisionHeld
	// DecisionMismatch: the key is known with a different payload
	// fingerprint.
	DecisionMismatch
)

func (d Decision) String() string {
	switch d {
	case DecisionExecute:
		return "execute"
	case DecisionReplay:
		return "replay"
	case DecisionHeld:
		return "held"
	case DecisionMismatch:
		return "mismatch"
	}
	return "unknown"
}

// Status is the state of a record.
type Status int

const (
	StatusInProgress Status = iota + 1
	StatusSucceeded
	StatusCachedFailure
	StatusRetryable
)

func (s Status) String() string {
	switch s {
	case StatusInProgress:
		return "in_progress"
	case StatusSucceeded:
		return "succeeded"
	case StatusCachedFailure:
		return "cached_failure"
	case StatusRetryable:
		return "retryable"
	}
	return "unknown"
}

// ErrorKind says why a failure is cached (Record.ErrorKind,
// Completion.ErrorKind). The stores persist its string; a store may hold a
// kind not listed here, written by another program.
type ErrorKind string

const (
	// ErrorKindCached: the handler's error is classified
	// policy.ClassCached (policy.Cached, or the policy's Classify).
	ErrorKindCached ErrorKind = "cached"
	// ErrorKindAttemptsExhausted: the handler failed retryably on its last
	// allowed attempt (policy.MaxAttempts).
	ErrorKindAttemptsExhausted ErrorKind = "attempts_exhausted"
)

// LeaseRequest asks for the key.
type LeaseRequest struct {
	Scope string
	Key   string
	// Fingerprint identifies the payload. When both it and the stored one are
	// non-empty and differ, ClaimLease returns DecisionMismatch.
	Fingerprint string
	// LeaseDuration is how long the lease lasts without Extend. Must be positive.
	LeaseDuration time.Duration
	// Retain is how long the record is kept at least, whatever its outcome
	// (the longest of the outcome TTLs): stores that remove records in the
	// background schedule the removal from it (store/postgres); stores whose
	// records expire by themselves may ignore it. Zero means LeaseDuration.
	Retain time.Duration
	// MessageUUID is the UUID of the message being delivered. A claim that
	// executes stores it in the record (Record.MessageUUID), replacing the
	// previous claimer's, so that an operator holding a message, dead-lettered
	// or not, finds its record whatever its key. It decides nothing.
	MessageUUID string
}

// ClaimResult is ClaimLease's answer.
type ClaimResult struct {
	Decision Decision
	// Claim is set for DecisionExecute.
	Claim Claim
	// Takeover is true for DecisionExecute when an expired lease of another worker
	// was taken over.
	Takeover bool
	// Record is the existing record for DecisionReplay, DecisionHeld and
	// DecisionMismatch, and nil for DecisionExecute.
	Record *Record
	// RetryIn is set for DecisionHeld when a retryable failure holds the
	// key's next attempt back (Completion.RetryAfter): how long, by the
	// store's clock, until a claim may execute. No delivery holds the key.
	RetryIn time.Duration
}

// Claim is the right to finish one execution of a key.
type Claim struct {
	Scope string
	Key   string
	// Token is the fencing token. It rises on every ClaimLease that executes the
	// key, so a newer attempt always holds a larger token than a stale one.
	Token int64
	// Attempt counts executions of the key across deliveries, from 1.
	Attempt int
	// ExpiresAt is the lease expiry by the store's clock, for information:
	// callers must not compare it with their own clock to decide anything.
	ExpiresAt time.Time
	// Version is opaque to callers: what the store last wrote for the lease,
	// kept by a store that can finish the lease with one compare-and-set
	// on it (store/redisstore on a server with SET IFEQ). Empty, or out of date
	// after an Extend, it costs such a store its slower path, never a
	// wrong answer.
	Version string
	// MessageUUID is the request's MessageUUID, which the claim stored: what
	// Transactional.RecordRollback writes into the record it leaves behind.
	MessageUUID string
}

// Completion is the outcome Complete stores, or, with StatusRetryable,
// what Store.Release and Transactional.RecordRollback leave behind.
type Completion struct {
	// Status is StatusSucceeded or StatusCachedFailure for Complete,
	// StatusRetryable for Release.
	Status Status
	// Result is the encoded result of a success.
	Result []byte
	// ErrorKind and ErrorMessage describe a cached failure.
	ErrorKind    ErrorKind
	ErrorMessage string
	// TTL is how long the outcome is replayed (for Complete, must be
	// positive), or how long a retryable record keeps its attempt count.
	TTL time.Duration
	// RetryAfter, for StatusRetryable, is the pause before the key's next
	// attempt, from now by the store's clock. Zero: none.
	RetryAfter time.Duration
	// Uncounted, for StatusRetryable, gives the lease's attempt back: the
	// record keeps the count it had before the lease (the delivery was
	// refused before the handler ran, by an open circuit).
	Uncounted bool
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
	ErrorKind      ErrorKind
	ErrorMessage   string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	// ExpiresAt is when the record stops being visible. For an in-progress
	// record it equals LeaseExpiresAt.
	ExpiresAt time.Time
	// RetryAt, for a retryable record, is when its next attempt may start
	// (Completion.RetryAfter); zero when nothing holds it back.
	RetryAt time.Time
	// MessageUUID is the UUID of the message whose delivery last claimed the
	// key (LeaseRequest.MessageUUID, TxRequest.MessageUUID): after a
	// takeover or a retry by another delivery it is the newest claimer's,
	// the one that ran last and whose outcome the record holds. Empty for
	// records written before stores kept it.
	MessageUUID string
}

// KafkaWatermarks is implemented by stores that can keep, for the
// one-transaction mode on Kafka, one row per (consumer group, topic,
// partition) instead of a record per message: the watermark mode
// (docs/kafka.md). KafkaWatermarks returns the Transactional whose claims
// read the message's position from its key ("<topic>/<partition>/<offset>",
// the form of keygen/kafkakeys.Offset): a message
// below the partition's watermark is a duplicate, any other executes and
// moves the watermark past it in the handler's transaction.
//
// group is the consumer group whose offsets the watermarks follow
// (required: offsets mean nothing outside a group's progress).
// highWaterMark returns the offset the next record produced to a partition
// will get (Kafka's high-water mark); the store asks it once per partition
// and process, the first time a message below the watermark arrives: a
// watermark above it means the topic was recreated, and the claim fails
// with ErrWatermarkAhead instead of acking every message as a duplicate
// (required).
type KafkaWatermarks interface {
	KafkaWatermarks(group string, highWaterMark func(ctx context.Context, topic string, partition int32) (int64, error)) (Transactional, error)
}

// ErrWatermarkAhead: a partition's stored watermark is above the
// partition's high-water mark, so its offsets started again (the topic was
// deleted and recreated). The watermark mode refuses to decide until an
// operator moves the watermark ("oncemill watermark move").
var ErrWatermarkAhead = errors.New("the stored watermark is ahead of the partition's high-water mark")

// KafkaPosition is where a message sits in Kafka.
type KafkaPosition struct {
	Topic     string
	Partition int32
	Offset    int64
}
