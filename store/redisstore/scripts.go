package redisstore

import "github.com/redis/go-redis/v9"

// The scripts work on one record (record.go) and touch one key, so they
// run on any Redis Cluster slot. Every redis.call costs a few
// microseconds, more than the Lua around it, so each makes as few as it
// can; ClaimLease of a new key and a replay make none (a plain SET NX, then a
// GET for a key that exists).
// They never read the clock: a lease is live while the key's PTTL is above
// its tail, a released record's pause holds while its PTTL is above its
// tail, and the times in the value come from the worker.
//
// Fields are matched and spliced as strings: tokens and times stay exact.
// The patterns match layout 1 only; a key of another layout is refused by
// the caller's checks (GET of a layout-0 hash fails with WRONGTYPE, and
// migrateScript converts it).

// Reply codes of the scripts.
const (
	codeLeaseLost = 6
	codeExpired   = 7
	codeOK        = 8
	// codeFinished: finishSrc found the record already finished by the
	// lease, with the status asked for, and touched it for WAIT.
	codeFinished = 9
)

// claimSrc takes a key that ClaimLease found held by an in-progress or released
// record, if it is still that record, its lease (if any) has run out and no
// pause holds it back. KEYS[1] the record; ARGV[1] the token ClaimLease saw,
// ARGV[2] its status letter, ARGV[3] its tail in ms, ARGV[4] the new value,
// ARGV[5] its PX. The tail of a released record is its pause: the record is
// held back while its PTTL is above it (0: no pause), as a lease is live
// while its PTTL is above its tail.
//
// Reply: 1 taken; 0 the key is gone (SET NX again); the current value when
// it is another record now (decide again); {value} when the lease is live;
// {value, ms} when a pause holds the key back ms longer.
const claimSrc = `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
if string.sub(v, 3, 3) ~= ARGV[2] or string.match(v, '^1|%a|(%d+)|') ~= ARGV[1] then return v end
local tail = tonumber(ARGV[3])
if ARGV[2] == 'p' then
  if redis.call('PTTL', KEYS[1]) > tail then return {v} end
elseif tail > 0 then
  local left = redis.call('PTTL', KEYS[1]) - tail
  if left > 0 then return {v, left} end
end
redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[5])
return 1
`

var claimScript = redis.NewScript(claimSrc)

// finishSrc ends a lease: Complete and Release. KEYS[1] the record.
// ARGV[1] the head of the lease's record ("1|p|<token>|"), ARGV[2] the new
// value up to its stable part, ARGV[3] its PX in ms, or 0 to remove the
// record, ARGV[4] "" or, with WAIT, the new status letter. Reply: codeOK or
// codeLeaseLost; with ARGV[4], codeFinished when the record is already the
// lease's, finished with that status (an earlier try whose WAIT failed):
// its TTL is set again, a write that the WAIT after the script then covers
// (WAIT waits for the connection's last write, and a script that writes
// nothing gives it none).
const finishSrc = `
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then
  if v and ARGV[4] ~= '' and string.sub(v, 1, #ARGV[1]) == '1|' .. ARGV[4] .. string.sub(ARGV[1], 4) then
    local t = redis.call('PTTL', KEYS[1])
    if t > 0 then
      redis.call('PEXPIRE', KEYS[1], t)
      return 9
    end
  end
  return 6
end
if ARGV[3] == '0' then
  redis.call('DEL', KEYS[1])
  return 8
end
redis.call('SET', KEYS[1], ARGV[2] .. string.sub(v, -4 - tonumber(string.sub(v, -4), 16)), 'PX', ARGV[3])
return 8
`

var finishScript = redis.NewScript(finishSrc)

// setIfEqSrc is SET ... IFEQ for a server without it: KEYS[1] the record,
// ARGV[1] the value it must hold, ARGV[2] the new value, ARGV[3] its PX.
// Reply: 1 set, 0 the record holds another value or none. A comparison of
// the whole value, as IFEQ makes it, is the cheapest script that finishes a
// lease: no pattern, no splice.
const setIfEqSrc = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return 1
`

var setIfEqScript = redis.NewScript(setIfEqSrc)

// extendSrc: KEYS[1] the record. ARGV[1] the head of the lease's record
// ("1|p|<token>|"), ARGV[2] the new lease in ms, ARGV[3] its expiry µs,
// ARGV[4] now µs. Reply: codeOK, codeLeaseLost, or codeExpired when the
// lease has run out.
const extendSrc = `
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, #ARGV[1]) ~= ARGV[1] then return 6 end
local att, tail, rest = string.match(v, '^(%d+)|(%d+)|%d+|%d+|()', #ARGV[1] + 1)
if redis.call('PTTL', KEYS[1]) <= tonumber(tail) then return 7 end
redis.call('SET', KEYS[1], ARGV[1] .. att .. '|' .. tail .. '|' .. ARGV[3] .. '|' .. ARGV[4] .. '|' .. string.sub(v, rest),
  'PX', tonumber(ARGV[2]) + tonumber(tail))
return 8
`

var extendScript = redis.NewScript(extendSrc)

// abandonSrc gives back a lease whose claim WAIT did not confirm. KEYS[1]
// the record, ARGV[1] the value the claim wrote, ARGV[2] 0 to remove it, or
// its tail in ms: the lease is left expired (PTTL at its tail), for the
// next claim to take over. Reply: 1 done, 0 the record is another now.
const abandonSrc = `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 1
`

var abandonScript = redis.NewScript(abandonSrc)

// deleteSrc: KEYS[1] the record. ARGV[1] the token. Reply:
// codeOK deleted, codeLeaseLost another token, 5 no record.
const deleteSrc = `
local v = redis.call('GET', KEYS[1])
if not v then return 5 end
if string.match(v, '^1|%a|(%d+)|') ~= ARGV[1] then return 6 end
redis.call('DEL', KEYS[1])
return 8
`

var deleteScript = redis.NewScript(deleteSrc)

// getSrc: KEYS[1] the record. Reply: {value, PTTL}, or 0 when absent.
const getSrc = `
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
return {v, redis.call('PTTL', KEYS[1])}
`

var getScript = redis.NewScript(getSrc)

// migrateSrc rewrites a record of layout 0 (a hash with the fields below,
// whose times were the server's clock in µs) in layout 1, keeping its
// remaining TTL; an expired lease keeps the rest of its grace as its tail.
// KEYS[1] the record. Reply: 1 when it rewrote or removed the key, 0 when
// the key is not a hash.
const migrateSrc = `
if redis.call('TYPE', KEYS[1]).ok ~= 'hash' then return 0 end
local r = redis.call('HMGET', KEYS[1], 'status', 'token', 'attempt', 'fp', 'exp', 'created', 'updated', 'result', 'ekind', 'emsg')
local pttl = redis.call('PTTL', KEYS[1])
local st = ({in_progress = 'p', succeeded = 's', failed = 'f', retryable = 'r'})[r[1]]
redis.call('DEL', KEYS[1])
if not st or not r[2] or not r[5] or pttl <= 0 then return 1 end
local tail = 0
if st == 'p' then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
  tail = math.max(0, math.floor(pttl - (tonumber(r[5]) - now) / 1000))
end
local fp, ek, em = r[4] or '', r[9] or '', r[10] or ''
local fixed = (r[6] or r[7] or r[5]) .. '|' .. fp
redis.call('SET', KEYS[1], '1|' .. st .. '|' .. r[2] .. '|' .. (r[3] or '1') .. '|' .. string.format('%d', tail) .. '|' .. r[5] ..
  '|' .. (r[7] or r[5]) .. '|' .. #ek .. ':' .. ek .. #em .. ':' .. em .. (r[8] or '') .. fixed .. string.format('%04x', #fixed),
  'PX', pttl)
return 1
`

var migrateScript = redis.NewScript(migrateSrc)
