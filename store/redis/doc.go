// Package redis is a store.Store on Redis (go-redis v9), shared by every
// worker that talks to the same Redis with the same key prefix: the fast
// shared store. It is not transactional with your business data, and it
// keeps what Redis keeps: see "Durability" below. It needs Redis 6.2 or
// later and is tested on Redis 7.0 and on a Redis Cluster.
//
// # Records
//
// Each (scope, key) is one Redis hash under
//
//	<prefix>:{<tag>}:r:<len(scope)>:<scope>:<key>
//
// with the fields status, token, attempt, exp, created, updated and, when
// not empty, fp, result, ekind and emsg. Times are microseconds since the
// Unix epoch by the Redis server's clock. The length of the scope comes
// first, so that no two (scope, key) pairs share a key however many colons,
// braces, quotes or binary bytes they hold: scope "a:b" with key "c" and
// scope "a" with key "b:c" are different records.
//
// # Scripts and tokens
//
// Begin, Complete, Release, Extend and Get are Lua scripts (EVALSHA, falling
// back to EVAL when Redis has lost its script cache), each one atomic step
// that reads the server's clock with TIME: no expiry is ever judged by a
// worker's clock. Complete, Release and Extend succeed only while the
// caller's token is the record's and the record is in progress; otherwise
// they return store.ErrLeaseLost and change nothing. Extend also refuses a
// lease that has run out. With Options.AutoPipeline the scripts of concurrent
// calls share round trips (go-redis's AutoPipeliner); each stays one atomic
// step.
//
// Fencing tokens come from a counter per Redis Cluster slot,
// <prefix>:{<tag>}:t, in the same slot as the records it serves: Begin sets
// the token to max(server time in µs, counter + 1, record's token + 1) and
// writes it back. So the tokens of a key strictly increase for as long as the
// counter lives, across Release, takeover, expiry and Delete, even when the
// server clock steps back; and if the counter is lost (FLUSHDB, a failover
// that dropped recent writes), the clock keeps new tokens above old ones as
// long as the server's clock has passed the moment they were handed out.
// There are at most 16384 counters per prefix, whatever the number of keys.
//
// # Expiry
//
// Every record has a native Redis TTL, so Redis frees it without help:
// finished records at their TTL, released ones after keep, and in-progress
// ones Options.LeaseGrace (default 1h) after their lease runs out. Until then
// an expired lease is invisible to Get but still counts attempts: the next
// Begin takes it over with attempt n+1, so attempts are counted across a
// worker crash. Visibility is judged by the stored expiry, never by the TTL.
// Durations above 100 years count as 100 years.
// DeleteExpired removes what has expired but not yet been freed by its TTL
// (mostly expired leases within their grace); it SCANs the prefix, so there
// is no need to run it on a schedule.
//
// # Redis Cluster
//
// A script may only touch keys of one slot. The {<tag>} of a record key is
// chosen so that the record and its slot's counter share a slot: the CRC16 of
// the record's identity picks the slot, and <tag> is a short fixed string
// that hashes to it. Records spread over all slots evenly, the scripts never
// cross slots, and DeleteExpired scans every master. The tags are part of the
// stored format and never change.
//
// # Durability
//
// The store remembers what Redis remembers. If Redis loses data (a restart
// without persistence, a failover before replication, eviction under
// maxmemory), the lost keys count as never seen and their redeliveries run
// the handler again. Run Redis with persistence (AOF) and
// maxmemory-policy noeviction where a second run is costly, or choose
// store/postgres, which also commits the outcome with the business writes.
package redis
