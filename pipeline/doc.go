// Package pipeline holds what a user of oncemill's pipeline names: Event
// and its Outcome, the stage's errors (DuplicateError among them),
// ClaimFromContext and CheckLease for the handler, RetryConfig and
// KafkaWatermark for the builder, and the dead-letter reasons. The pipeline
// itself is assembled by package receiver's builder, the one way to build it.
//
// The idempotency stage does what docs/concepts.md's table "What a
// duplicate gets" says:
//
//   - Execute: the handler runs under a lease that a heartbeat keeps alive
//     (receiver.New), or in the claim's transaction
//     (receiver.NewTransactional). On success the produced messages (UUID,
//     metadata, payload) are stored as the result and returned to the
//     router.
//   - Replay of a success: the stored produced messages are returned again
//     with the same UUIDs, so the router re-publishes what a crash lost.
//   - Replay of a cached failure: acked; the handler is not run.
//     Under policy.FinishedKeyReject a duplicate of either is rejected
//     instead: acked, dead-lettered, ErrDuplicateRejected.
//   - In progress: wait up to a bound, then replay or nack after a delay
//     (ErrKeyHeld).
//   - Mismatch, or a key that cannot be computed: a permanent failure, acked.
//   - A retryable failure releases the key and nacks; after
//     policy.MaxAttempts deliveries the failure is cached instead, unless
//     policy.NeverCacheFailures says no failure is ever cached.
//
// A duplicate that is neither run nor replayed has a *DuplicateError,
// which says what the store holds for its key (errors.As).
//
// In shadow mode (receiver's WithShadow) only Execute is acted on: every
// other answer of the store, and a message without a usable key, runs the
// handler unguarded instead, and is reported as what enforcement would
// have done (Event.Shadow), for rolling the stage out on a live consumer
// (docs/operations.md). Every delivery is then acked or nacked as the bare
// handler's result says, and none is dead-lettered.
//
// A panic in the handler is recovered like Watermill's middleware.Recoverer
// does: it becomes a middleware.RecoveredPanicError carrying the stack, the
// key is released (or the failure cached, if the policy says so), and the
// error goes back to the router. Put Recoverer outside oncemill if you want
// it for other middlewares too; it sees an error, never a panic.
//
// The handler reads its fencing token and attempt number with
// ClaimFromContext(msg.Context()).
package pipeline
