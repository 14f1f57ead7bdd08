// Package memory is an in-memory store.Store for a single process: tests,
// development, and workers whose duplicates all arrive at one instance.
// Records live only as long as the process.
//
// The store is split into shards, each with its own lock and map, picked by
// a hash of (scope, key); there is no global lock on any operation. A key
// always lands on the same shard, and each shard counts fencing tokens, so
// the tokens of one key strictly increase for the life of the store, across
// Release, takeover, expiry and Delete.
//
// Expiry is judged by Options.Now. An expired record is invisible at once;
// a background sweeper (Options.CleanupInterval) frees its memory later.
//
// Visibility rules, shared with every store through store/storetest:
//
//   - Get returns a record only while the clock is before its ExpiresAt. For
//     an in-progress record that is the lease expiry, so Get reports an
//     expired lease as store.ErrNotFound.
//   - ClaimLease on an in-progress record whose lease has expired takes it over
//     with attempt n+1. Once the sweeper has removed such a record (after
//     the claim's LeaseRequest.Retain), the next ClaimLease starts again at
//     attempt 1.
//   - Complete and Release accept a lease whose expiry has passed as long as
//     its token is still current (nobody took it over and it was not swept):
//     finishing late is safe because the token proves nobody else ran the
//     key. Extend refuses an expired lease.
//
// Result bytes are copied on the way in and out, so callers cannot change
// stored state through a slice they hold.
package memory
