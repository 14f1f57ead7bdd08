package tiered

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store"
)

const (
	// fillWindow bounds how long after its read of the truth a fill may
	// still write Redis; tombstoneTTL, well above it, is how long a Delete's
	// tombstone blocks fills. A fill that read the record before the Delete
	// therefore meets the tombstone, or is dropped.
	fillWindow   = 10 * time.Second
	tombstoneTTL = time.Minute
	// clockSyncInterval is how old the newest sample of Redis's clock may
	// be before a fill takes a new one (Redis TIME).
	clockSyncInterval = 30 * time.Second
	// minRedisLife: a record with less left than this is not written to
	// Redis.
	minRedisLife = 2 * time.Millisecond
)

// redisTier is the shared tier: finished records under
// <prefix>:r:<idString>, and the channel <prefix>:invalidate on which every
// store of the prefix hears Deletes.
type redisTier struct {
	client  redis.UniversalClient
	prefix  string
	channel string
	// downUntil is the local time until which Redis is left alone after a
	// failure (Options.RedisBackoff).
	downUntil atomic.Int64
}

func (r *redisTier) key(k id) string { return r.prefix + ":r:" + idString(k) }

// forgetScript deletes a record, but never a tombstone: a tombstone must
// outlive the fills it blocks.
var forgetScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.byte(v, 1) == 82 then return redis.call('DEL', KEYS[1]) end
return 0`)

// redisUp reports whether Redis is to be tried now; when it is backed off,
// the call counts as a fallback of operation o.
func (s *Store) redisUp(ctx context.Context, o op, now int64) bool {
	if until := s.redis.downUntil.Load(); until != 0 && now < until {
		s.tel.fellBack(ctx, o)
		return false
	}
	return true
}

// redisFailed counts a failed Redis call of operation o and backs Redis
// off. A call cut short by the caller's own context is not Redis's fault.
func (s *Store) redisFailed(ctx context.Context, o op, err error) {
	if ctx.Err() != nil {
		return
	}
	s.tel.fellBack(ctx, o)
	if s.opts.RedisBackoff <= 0 {
		return
	}
	now := s.now()
	if prev := s.redis.downUntil.Swap(now + int64(s.opts.RedisBackoff)); prev <= now {
		s.opts.Logger.Warn("oncemill: tiered: a Redis call failed; the truth answers alone until Redis is tried again",
			"operation", opNames[o], "backoff", s.opts.RedisBackoff, "error", err)
	}
}

// redisGet reads k's record from Redis with its remaining TTL, in one
// round trip (GET and PTTL pipelined). deadline is the local time by which
// the Redis entry has expired at the latest: its PTTL counted from before
// the request was sent, less the margin.
func (s *Store) redisGet(ctx context.Context, k id, o op) (rec store.Record, deadline int64, ok bool) {
	now := s.now()
	if !s.redisUp(ctx, o, now) {
		return rec, 0, false
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
	defer cancel()
	key := s.redis.key(k)
	pipe := s.redis.client.Pipeline()
	get := pipe.Get(rctx, key)
	pttl := pipe.PTTL(rctx, key)
	if _, err := pipe.Exec(rctx); err != nil && !errors.Is(err, redis.Nil) {
		s.redisFailed(ctx, o, err)
		return rec, 0, false
	}
	v, err := get.Bytes()
	if err != nil { // redis.Nil: not cached
		return rec, 0, false
	}
	ttl := pttl.Val()
	if ttl <= 0 { // gone in between, or a key without a TTL: not ours
		return rec, 0, false
	}
	rec, ok = decodeRecord(k, v)
	return rec, now + int64(ttl) - int64(s.opts.ClockMargin), ok
}

// redisFill writes rec to Redis unless k holds anything already (a
// tombstone of a recent Delete, or the same record), to expire by Redis's
// clock no later than local time deadline. readStart is the local time at
// which the caller began the read or write of the truth that rec comes
// from.
func (s *Store) redisFill(ctx context.Context, k id, rec *store.Record, deadline, readStart int64, o op) {
	now := s.now()
	if deadline-now < int64(minRedisLife) || now-readStart > int64(fillWindow) || !s.redisUp(ctx, o, now) {
		return
	}
	lo, ok := s.redisOffset(ctx, o, now)
	if !ok {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
	defer cancel()
	// PXAT in Redis's clock, rounded down: however late Redis applies the
	// SET, the entry is gone by deadline.
	at := time.UnixMilli((deadline + lo) / int64(time.Millisecond))
	err := s.redis.client.SetArgs(rctx, s.redis.key(k), encodeRecord(rec), redis.SetArgs{Mode: "NX", ExpireAt: at}).Err()
	if err != nil && !errors.Is(err, redis.Nil) { // Nil: the key held something
		s.redisFailed(ctx, o, err)
	}
}

// redisForget removes k's record from Redis, best effort: it is never
// needed for correctness (a cached record expires before the truth can
// hold another outcome of its key), so a failure is counted, not returned.
func (s *Store) redisForget(ctx context.Context, k id, o op) {
	if !s.redisUp(ctx, o, s.now()) {
		return
	}
	rctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
	defer cancel()
	if err := forgetScript.Run(rctx, s.redis.client, []string{s.redis.key(k)}).Err(); err != nil && !errors.Is(err, redis.Nil) {
		s.redisFailed(ctx, o, err)
	}
}

// redisOffset returns a lower bound of Redis's clock minus the local one
// (nanoseconds), sampling Redis TIME first when the newest sample is
// older than clockSyncInterval. One goroutine samples at a time; the
// others go on with what is known.
func (s *Store) redisOffset(ctx context.Context, o op, now int64) (int64, bool) {
	if age, ok := s.redisClock.age(now); (!ok || age > int64(clockSyncInterval)) && s.syncMu.TryLock() {
		s.syncRedisClock(ctx, o)
		s.syncMu.Unlock()
		now = s.now()
	}
	return s.redisClock.lower(now)
}

// syncRedisClock samples the clock of every node that holds records: one
// Redis, every master of a cluster, every shard of a ring. The sample it
// keeps is the loosest of them, so it holds for whichever node has the
// key.
func (s *Store) syncRedisClock(ctx context.Context, o op) {
	rctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
	defer cancel()
	var (
		mu       sync.Mutex
		combined *offset
	)
	sample := func(ctx context.Context, c redis.Cmdable) error {
		send := s.now()
		t, err := c.Time(ctx).Result()
		if err != nil {
			return err
		}
		got := sampleOffset(t.UnixNano(), send, s.now())
		mu.Lock()
		defer mu.Unlock()
		if combined == nil {
			combined = &got
		} else {
			combined.lo, combined.hi, combined.at = min(combined.lo, got.lo), max(combined.hi, got.hi), min(combined.at, got.at)
		}
		return nil
	}
	var err error
	switch c := s.redis.client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(rctx, func(ctx context.Context, n *redis.Client) error { return sample(ctx, n) })
	case *redis.Ring:
		err = c.ForEachShard(rctx, func(ctx context.Context, n *redis.Client) error { return sample(ctx, n) })
	default:
		err = sample(rctx, c)
	}
	if err != nil {
		s.redisFailed(ctx, o, err)
		return
	}
	if combined != nil {
		s.redisClock.observe(*combined)
	}
}

// subscribe listens for invalidations until Close. Every
// (re)subscription empties the local tier: invalidations sent while the
// subscription was down are lost, so whatever it held then may be stale.
func (s *Store) subscribe(ps *redis.PubSub) {
	defer close(s.subDone)
	_ = ps.Subscribe(context.Background(), s.redis.channel) // on failure the channel below retries
	for m := range ps.ChannelWithSubscriptions(redis.WithChannelHealthCheckInterval(time.Second)) {
		switch m := m.(type) {
		case *redis.Subscription:
			s.purgeLocal()
			if m.Kind == "subscribe" {
				s.subscribed.Store(true)
			}
		case *redis.Message:
			if k, ok := parseID(m.Payload); ok {
				s.invalidateLocal(k)
			}
		}
	}
}
