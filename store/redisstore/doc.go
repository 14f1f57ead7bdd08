// Package redis is a store.Store on Redis (go-redis v9), shared by every
// worker that talks to the same Redis with the same key prefix: the fast
// shared store. It is not transactional with your business data, and it
// keeps what Redis keeps: see "Durability" below. It needs Redis 7.0 or
// later and is tested on Redis 7.0, on a Redis Cluster, and on Valkey 8.1,
// which like Redis 8.4 has SET IFEQ.
//
// # Records
//
// Each (scope, key) is one Redis string under
//
//	<prefix>:{<tag>}:r:<len(scope)>:<scope>:<key>
//
// in a versioned layout (record.go): status, fencing token, attempt, the
// times, the cached error, the result, and last the part that never changes
// while the record lives (creation time and fingerprint). The length of the
// scope comes first in the key, so that no two (scope, key) pairs share a
// key however many colons, braces, quotes or binary bytes they hold.
//
// # Commands
//
// ClaimLease of a new key is one SET NX PX that writes the lease; a duplicate of
// a finished one is that SET NX and a GET of the record to replay. A key
// held by an in-progress or released record goes to a short script that
// takes it once the lease has run out. Complete and Release are one
// compare-and-set each: a SET of the new value if the record still holds
// the value the lease wrote (store.Claim.Version), with SET IFEQ on a
// server that has it and otherwise a script that does the same (GET,
// compare, SET). The store learns that a server has no IFEQ from its first
// refusal. When the compare misses, because an Extend rewrote the value or
// the lease is lost, the finish script (GET, compare the record's head
// with the lease's token, SET) decides. Extend and Get are scripts.
// Complete, Release and
// Extend succeed only while the record is in progress under the caller's
// token; otherwise they return store.ErrLeaseLost and change nothing. With
// Options.AutoPipeline the commands of concurrent calls share round trips
// (go-redis's AutoPipeliner) while more than 4 calls are under way.
//
// A key's fencing token rises with every lease while its record lives
// (previous token + 1, or the worker's clock in microseconds, whichever is
// larger); after the record is gone the next token comes from the clock.
//
// # Expiry
//
// Expiry is Redis's own: every record has a native TTL, so a record is
// visible while its key exists. A finished record lives for its outcome's
// TTL, a released one for its TTL (store.Completion.TTL), an in-progress one for its lease plus a tail
// (the ClaimLease's Retain), during which an expired lease still counts attempts:
// the next ClaimLease takes it over with attempt n+1. A lease is live while the
// key's PTTL is above its tail. A release's pause (store.Completion.RetryAfter)
// is judged the same way: the released record holds the next attempt back
// (store.DecisionHeld with RetryIn) while the key's PTTL is above its TTL
// less the pause. No expiry is judged by a worker's clock, and no cleanup is
// needed. Durations above 100 years count as 100 years.
//
// # Redis Cluster
//
// Every command touches one key. The {<tag>} of a record key is chosen so
// that records spread over all slots evenly: the CRC16 of the record's
// identity picks the slot, and <tag> is a short fixed string that hashes to
// it. The tags are part of the stored format and never change.
//
// # Durability
//
// The store remembers what Redis remembers. If Redis loses data (a restart
// without persistence, a failover before replication, eviction under
// maxmemory), the lost keys count as never seen and their redeliveries run
// the handler again. Run Redis with persistence (AOF) and
// maxmemory-policy noeviction where a second run is costly, or choose
// store/postgres, which also commits the outcome with the business writes.
package redisstore
