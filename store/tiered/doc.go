// Package tiered is a store in three tiers: a bounded in-process LRU of
// finished records, Redis as a cache of finished records shared by every
// worker, and a truth, store/postgres, that decides everything. Replays are
// served from the nearest tier that has the record; Redis is only ever a
// cache, never the place where a decision is made.
//
//	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
//	st, err := tiered.New(pg, client, tiered.Options{})
//	...
//	defer st.Close()
//	r, err := receiver.New(st).Build()            // the lease mode, or
//	r, err := receiver.NewTransactional(st).Build() // the one-transaction mode
//
// # What goes where
//
// Only finished records (succeeded or failed) are cached. ClaimLease and Claim
// look in the local tier, then in Redis (a hit there also fills the local
// tier), and answer a finished record as the truth would: a replay, or a
// mismatch when both fingerprints are set and differ. A miss goes to the
// truth, which decides; a replay or mismatch it answers is cached.
// Everything that changes a record goes to the truth first: Complete, and
// in the one-transaction mode Commit and a cached failure's
// RecordRollback, write the finished record through to both caches once
// the truth has it (after a successful commit, never before). Release,
// Extend, Get and List are the truth's, and so are Limits and the removal
// of expired records (store/postgres's cleaner).
//
// # A cached record never outlives its truth
//
// Every cached copy expires no later than the truth's record, less
// Options.ClockMargin, whichever way it got there:
//
//   - Write-through: the truth's record lives TTL (SuccessTTL) from the
//     moment it wrote it, which comes after this process sent the call, so
//     the copy expires TTL after the send by the local monotonic clock.
//   - A replay read from the truth carries its expiry by the truth's clock.
//     The store relates that clock to its own from the leases the truth
//     hands out: a lease taken by ClaimLease expires Lease after the truth's
//     now(), which was read between this process's send and receive, so
//     each one bounds the offset (Extend too). The copy expires at the
//     truth's expiry converted with the offset's upper bound. Until the
//     store has seen a lease (a process that only claims in the
//     one-transaction mode never does), replays read from the truth are
//     not cached.
//   - Redis: entries are written with SET .. NX PXAT, the deadline in
//     Redis's own clock, related to the local one by Redis TIME (sampled
//     when a fill finds the newest sample older than 30 s, on every
//     master of a cluster). Redis enforces the expiry itself, so a SET
//     that Redis applies late is still gone in time. A Redis hit is
//     cached locally until its PTTL runs out, counted from before the GET
//     was sent.
//   - The local tier keeps an entry MaxLocalAge at most.
//
// The assumption is that clocks run at the same rate, within 500 ppm, which
// the sample bounds are widened by with their age; a clock that is stepped
// (set by hand) is not covered beyond ClockMargin.
//
// # Deletes and invalidation
//
// Delete writes a tombstone over the key in Redis first (it lives a minute,
// and fills are written with NX, so a fill that read the record before the
// Delete cannot put it back), then deletes from the truth, then drops the
// key from this process's local tier and publishes the key on
// <prefix>:invalidate, a channel every store of the prefix subscribes to.
// A Delete that cannot write the tombstone fails and deletes nothing: it
// would leave Redis serving the record. A Delete whose invalidation cannot
// be published fails after deleting, saying so.
//
// What a Delete guarantees, once it returned nil: this process and Redis
// never replay the deleted record; every other store's local tier drops
// it when the invalidation arrives (a Redis round trip), and in any case
// within MaxLocalAge of having cached it. An invalidation can be lost only
// while a store's subscription is down; each (re)subscription empties that
// store's local tier. A fill that raced with an invalidation is undone
// (the local tier counts invalidations, and a fill that saw the count move
// takes its entry out again).
//
// Release and RecordRollback of a retryable failure take the key out of
// the local tier and out of Redis (never removing a tombstone), best
// effort: a finished record of a key is only cached while the truth holds
// it, and a key the truth holds finished cannot be leased, released or
// rolled back, so there is never anything to remove. A failure to reach
// Redis there is counted, not returned.
//
// # Redis failures
//
// Every Redis call is bounded by Options.RedisTimeout, through its context:
// New refuses a go-redis client whose ContextTimeoutEnabled is false, since
// that client would wait its ReadTimeout instead. A failed call
// (refused, reset, timed out) never reaches the caller of ClaimLease, Claim,
// Complete, Commit, Release or RecordRollback: a read falls back to the
// truth, a fill or removal is dropped, and the metric
// oncemill.store.tier.fallbacks counts it by operation. After a failure
// the store leaves Redis alone for Options.RedisBackoff, so a dead Redis
// costs one timeout per backoff, not one per delivery. Only Delete fails
// when Redis cannot be reached, for the reason above.
//
// # Metrics
//
// oncemill.store.tier.fallbacks (operation) counts the Redis calls the
// store went on without; oncemill.store.tier.replays (tier: local, redis,
// truth) counts the replays and mismatches each tier answered.
//
// # Redis keys
//
// <prefix>:r:<len(scope)>:<scope>:<key> holds a record in this package's
// own versioned layout, or a tombstone (record.go). Every command touches
// one key, so a Redis Cluster needs no hash tags.
package tiered
