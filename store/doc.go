// Package store defines the contract between oncemill's idempotency stage and
// the place where it remembers what happened to each key.
//
// One record exists per (scope, key). ClaimLease is one atomic step that either
// hands the caller a lease (DecisionExecute), returns a finished outcome
// (DecisionReplay), reports a live lease held by someone else (DecisionHeld),
// or reports that the same key arrived with a different payload
// (DecisionMismatch):
//
//	absent ──ClaimLease──> IN_PROGRESS(token, lease expiry, attempt n)
//	IN_PROGRESS ──Complete(success)──> SUCCEEDED(result, expires = now+TTL)
//	IN_PROGRESS ──Complete(failure)──> FAILED(kind, message, expires = now+TTL)
//	IN_PROGRESS ──Release──> RETRYABLE(attempt n, expires = now+keep)
//	IN_PROGRESS, lease expired ──ClaimLease──> IN_PROGRESS(new token, attempt n+1)
//	RETRYABLE ──ClaimLease──> IN_PROGRESS(new token, attempt n+1)
//	any record, expired ──ClaimLease──> IN_PROGRESS(attempt 1)
//
// Complete, Release and Extend succeed only while the caller's fencing token
// is the current one; otherwise they return ErrLeaseLost and change nothing.
// Every expiry is judged by the store's own clock.
//
// Every implementation passes the contract suite in store/storetest.
package store
