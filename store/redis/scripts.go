package redis

import goredis "github.com/redis/go-redis/v9"

// The scripts keep one record in one Redis hash:
//
//	status     in_progress | succeeded | failed | retryable
//	token      fencing token of the current or last lease
//	attempt    executions of the key so far, from 1
//	exp        when the record stops being visible; while in_progress, the
//	           lease expiry
//	created    when the record was created
//	updated    when it last changed
//	fp         payload fingerprint (absent when empty)
//	result     the stored result (absent when empty)
//	ekind      error kind of a cached failure (absent when empty)
//	emsg       error message of a cached failure (absent when empty)
//
// Times are microseconds since the Unix epoch by the server's clock (TIME),
// plus ARGV[1], a clock offset in microseconds that only tests set. They,
// and tokens, stay below 2^53, so Lua's doubles hold them exactly. They go
// to redis.call and back to the client as Lua numbers, which Redis writes
// out as exact integers (Lua's own tostring would round them to 14 digits,
// and string.format costs about half a redis.call).
//
// Each record also has a native TTL (PEXPIRE) so that Redis frees it without
// help: its expiry for finished and released records, its lease expiry plus
// a grace period for in-progress records (the grace keeps the attempt count
// for a takeover after a crash). Visibility is always judged by the stored
// exp, never by the TTL.
//
// Every redis.call costs a few microseconds, more than the Lua around it, so
// the scripts make as few as they can: Begin of a new key makes five (TIME,
// HMGET, SET of the counter, HSET, PEXPIRE), Complete four.

const prelude = `
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2]) + tonumber(ARGV[1])
end
`

// Reply codes of the scripts.
const (
	codeExecute    = 1
	codeReplay     = 2
	codeInProgress = 3
	codeMismatch   = 4
	codeNotFound   = 5
	codeLeaseLost  = 6
	codeExpired    = 7
	codeOK         = 8
)

// recordFields is the order in which scripts return a record.
const recordFields = `'status', 'token', 'attempt', 'fp', 'exp', 'created', 'updated', 'result', 'ekind', 'emsg'`

// recordFieldNames are recordFields for a client's HMGET.
var recordFieldNames = []string{"status", "token", "attempt", "fp", "exp", "created", "updated", "result", "ekind", "emsg"}

// beginSrc: KEYS[1] the record, KEYS[2] the slot's token counter.
// ARGV[2] fingerprint, ARGV[3] lease in µs, ARGV[4] native TTL in ms,
// ARGV[5] the claim's Retain in µs (kept in 'purge': DeleteExpired leaves an
// expired lease alone until then).
//
// Reply: {1, token, attempt, lease expiry, takeover (0/1)} for Execute, or
// {code, record fields...} for Replay, InProgress and Mismatch.
//
// The token is max(now, counter + 1, record token + 1) and is written back
// to the counter: strictly rising per slot (so per key) for as long as the
// counter lives, across Delete and expiry, whatever the clock does; and
// after a failover that lost the newest writes, the clock part keeps a new
// token from repeating one handed out before. SET .. GET reads and writes
// the counter in one call; only when the counter is ahead of the clock (a
// clock step back) does it take a second.
const beginSrc = prelude + `
local now = now_us()
local r = redis.call('HMGET', KEYS[1], ` + recordFields + `)
local status, exp = r[1], tonumber(r[5])
local fp = ARGV[2]
local carry, takeover = false, 0
if status then
  local live = exp ~= nil and now < exp
  if live or status == 'in_progress' then
    -- A live record, or an expired lease whose attempt count carries on:
    -- either way it must be the same payload.
    if fp ~= '' and r[4] and r[4] ~= '' and r[4] ~= fp then
      table.insert(r, 1, 4)
      return r
    end
    if status == 'in_progress' then
      if live then
        table.insert(r, 1, 3)
        return r
      end
      takeover = 1
    elseif status ~= 'retryable' then
      table.insert(r, 1, 2)
      return r
    end
    carry = true
  end
end

local tok = now
local old = tonumber(r[2])
if old and old >= tok then tok = old + 1 end
local c = tonumber(redis.call('SET', KEYS[2], tok, 'GET'))
if c and c >= tok then
  tok = c + 1
  redis.call('SET', KEYS[2], tok)
end

local lexp = now + tonumber(ARGV[3])
local attempt = 1
local f = {'status', 'in_progress', 'token', tok, 'exp', lexp, 'purge', lexp + tonumber(ARGV[5]), 'updated', now}
if carry then
  attempt = tonumber(r[3]) + 1
else
  if status then redis.call('DEL', KEYS[1]) end
  f[#f+1] = 'created'
  f[#f+1] = now
end
f[#f+1] = 'attempt'
f[#f+1] = attempt
if fp ~= '' then
  f[#f+1] = 'fp'
  f[#f+1] = fp
end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {1, tok, attempt, lexp, takeover}
`

var beginScript = goredis.NewScript(beginSrc)

// holderCheck leaves the script with codeLeaseLost unless the record is in
// progress under the token in ARGV[2].
const holderCheck = `
local cur = redis.call('HMGET', KEYS[1], 'status', 'token', 'exp', 'attempt')
if cur[1] ~= 'in_progress' or tonumber(cur[2]) ~= tonumber(ARGV[2]) then return 6 end
`

// completeSrc: KEYS[1] the record. ARGV[2] token, ARGV[3] status,
// ARGV[4] result, ARGV[5] error kind, ARGV[6] error message, ARGV[7] TTL in
// µs, ARGV[8] native TTL in ms. Reply: codeOK or codeLeaseLost.
//
// An in-progress record never has result, ekind or emsg, so nothing needs
// deleting.
const completeSrc = prelude + holderCheck + `
local now = now_us()
local f = {'status', ARGV[3], 'exp', now + tonumber(ARGV[7]), 'updated', now}
if ARGV[4] ~= '' then f[#f+1] = 'result'; f[#f+1] = ARGV[4] end
if ARGV[5] ~= '' then f[#f+1] = 'ekind'; f[#f+1] = ARGV[5] end
if ARGV[6] ~= '' then f[#f+1] = 'emsg'; f[#f+1] = ARGV[6] end
redis.call('HSET', KEYS[1], unpack(f))
redis.call('PEXPIRE', KEYS[1], ARGV[8])
return 8
`

var completeScript = goredis.NewScript(completeSrc)

// releaseSrc: KEYS[1] the record. ARGV[2] token, ARGV[3] keep in µs
// (<= 0 removes the record), ARGV[4] native TTL in ms. Reply: codeOK or
// codeLeaseLost.
const releaseSrc = prelude + holderCheck + `
local keep = tonumber(ARGV[3])
if keep <= 0 then
  redis.call('DEL', KEYS[1])
  return 8
end
local now = now_us()
redis.call('HSET', KEYS[1], 'status', 'retryable', 'exp', now + keep, 'updated', now)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return 8
`

var releaseScript = goredis.NewScript(releaseSrc)

// extendSrc: KEYS[1] the record. ARGV[2] token, ARGV[3] new lease in µs,
// ARGV[4] native TTL in ms. Reply: {codeOK, lease expiry, attempt},
// codeLeaseLost, or codeExpired when the lease has run out.
const extendSrc = prelude + holderCheck + `
local now = now_us()
if now >= tonumber(cur[3]) then return 7 end
local lexp = now + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], 'exp', lexp, 'updated', now)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
return {8, lexp, cur[4]}
`

var extendScript = goredis.NewScript(extendSrc)

// getSrc: KEYS[1] the record. Reply: {codeOK, record fields...} or
// codeNotFound when absent or expired.
const getSrc = prelude + `
local r = redis.call('HMGET', KEYS[1], ` + recordFields + `)
if not r[1] or now_us() >= tonumber(r[5]) then return 5 end
table.insert(r, 1, 8)
return r
`

var getScript = goredis.NewScript(getSrc)

// deleteExpiredSrc: KEYS[1] a record. Removes it if it has expired, and,
// for an expired lease, once its claim's Retain ('purge') has passed too,
// so that the lease's attempt count carries on until then. Reply: 1 when
// removed, else 0.
const deleteExpiredSrc = prelude + `
local r = redis.call('HMGET', KEYS[1], 'exp', 'status', 'purge')
local exp, now = tonumber(r[1]), now_us()
if exp and now >= exp and (r[2] ~= 'in_progress' or now >= (tonumber(r[3]) or exp)) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
`

var deleteExpiredScript = goredis.NewScript(deleteExpiredSrc)
