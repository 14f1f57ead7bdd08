// Package filestore is a store.Store and store.Admin in one file on disk,
// for a single worker process with no shared database: what it records
// survives a restart or a crash of the process, unlike store/memory's.
//
// The file is a bbolt database (go.etcd.io/bbolt): a copy-on-write B+tree
// in one file, whose every committed transaction is synced to disk before
// the call that wrote it returns. A claim that executes the key and the
// Complete after the handler each commit one transaction; claims that find
// the key held, finished or mismatched read only. Writes that arrive while
// a commit is running are committed together in the next one, so that
// concurrent handlers share its sync.
//
// One process at a time holds the file (bbolt locks it): New waits up to
// Options.OpenTimeout for another one to close it, then fails with
// ErrLocked. Several workers that receive the same messages need a store
// they share (store/postgres, store/redisstore); see docs/stores.md, which compares them.
//
// Records are keyed by scope and key in one bucket, in (scope, key) order,
// so that Admin.List pages through a scope by seeking to it. Each value is
// the whole store.Record in JSON, behind a small header with the times the
// sweeper reads: a field added to store.Record is stored with no change
// here. The fencing tokens come from one counter in the file, so they rise
// across restarts too.
//
// Expiry is judged by Options.Now, a wall clock: the stored times are read
// again after a restart. An expired record is invisible at once; a
// background sweeper (Options.CleanupInterval) removes it later, freeing
// its pages for new records (the file keeps its size). The visibility rules
// are those of every store, checked by store/storetest (see store/memory):
// an expired lease is taken over with its attempt count until the claim's
// LeaseRequest.Retain has passed, and Complete and Release accept a lease
// past its expiry as long as nobody took it over. A release's pause
// (store.Completion.RetryAfter) is judged by the same clock: it ends at the
// record's RetryAt.
package filestore
