package tiered

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	lru "github.com/hashicorp/golang-lru/v2"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// Truth is the store of record: every operation that decides or changes
// anything goes to it. *postgres.Store is one.
type Truth interface {
	store.Store
	store.Admin
	store.Transactional
}

// Store is a store.Store, store.Admin and store.Transactional in three
// tiers: an in-process LRU and Redis hold finished records for replays,
// the truth decides everything else. It is safe for concurrent use. Create
// it with New and stop it with Close.
type Store struct {
	truth Truth
	opts  Options
	local *localTier // nil: turned off
	redis redisTier
	tel   *telemetry

	base     time.Time // local time 0 (monotonic)
	baseWall int64     // base as Unix nanoseconds
	skew     atomic.Int64

	// truthClock relates the truth's clock to the local one, from the
	// leases the truth hands out; redisClock relates Redis's, from TIME.
	truthClock, redisClock remoteClock
	syncMu                 sync.Mutex // one Redis TIME sample at a time

	// seq counts invalidations of the local tier. A fill reads it before
	// it reads the truth or Redis, and takes its entry out again if it
	// moved: an invalidation that overtook the fill wins.
	seq atomic.Uint64

	// pending holds the fingerprint of each lease this store handed out
	// until Complete or Release, which need it to write the finished
	// record through. Bounded: a lease forgotten here is only not written
	// through.
	pending *lru.Cache[pendingKey, pendingLease]

	ps         *redis.PubSub
	subDone    chan struct{}
	subscribed atomic.Bool
	closed     atomic.Bool
	closeOnce  sync.Once
}

var (
	_ store.Store         = (*Store)(nil)
	_ store.Admin         = (*Store)(nil)
	_ store.Transactional = (*Store)(nil)
)

type pendingKey struct {
	id    id
	token int64
}

type pendingLease struct {
	fingerprint string
	messageUUID string
	created     time.Time // the truth's clock when the lease was taken
}

const pendingCapacity = 1 << 16

// New returns a tiered store over truth, caching finished records in an
// in-process LRU and in Redis through cache. New does no I/O on the
// caller's goroutine: the subscription to invalidations starts in the
// background. The truth and the client stay the caller's: Close closes
// neither.
func New(truth Truth, cache redis.UniversalClient, opts Options) (*Store, error) {
	if truth == nil {
		return nil, configerr.New("tiered.New", "truth is nil; pass the store of record, a *postgres.Store")
	}
	if cache == nil {
		return nil, configerr.New("tiered.New", "cache is nil; pass a go-redis client (redis.NewClient or NewClusterClient)")
	}
	if !boundedByContext(cache) {
		return nil, configerr.New("tiered.New", "the Redis client's ContextTimeoutEnabled is false, so go-redis would wait its ReadTimeout (3s by default) for a stalled Redis and Options.RedisTimeout could not bound the call; set ContextTimeoutEnabled: true in its options")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	local, err := newLocalTier(opts.LocalCapacity, opts.LocalMaxRecordBytes)
	if err != nil {
		return nil, fmt.Errorf("oncemill: tiered: local tier: %w", err)
	}
	pending, err := lru.New[pendingKey, pendingLease](pendingCapacity)
	if err != nil {
		return nil, fmt.Errorf("oncemill: tiered: %w", err)
	}
	tel, err := newTelemetry(opts.MeterProvider)
	if err != nil {
		return nil, err
	}
	base := time.Now()
	s := &Store{
		truth:    truth,
		opts:     opts,
		local:    local,
		redis:    redisTier{client: cache, prefix: opts.Prefix, channel: opts.Prefix + ":invalidate"},
		tel:      tel,
		base:     base,
		baseWall: base.UnixNano(),
		pending:  pending,
		ps:       cache.Subscribe(context.Background()), // no channel yet: no I/O
		subDone:  make(chan struct{}),
	}
	go s.subscribe(s.ps)
	return s, nil
}

// boundedByContext reports whether the client's calls end at their
// context's deadline: go-redis honours it for socket reads and writes only
// with ContextTimeoutEnabled. A client of another type is taken on trust.
func boundedByContext(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// Limits implements store.Store and store.Transactional: the truth's.
func (s *Store) Limits() store.Limits { return s.truth.Limits() }

// Close stops the subscription to invalidations and empties the local
// tier. Afterwards every operation returns store.ErrClosed; a
// one-transaction claim taken before Close can still commit or roll back.
// Close is idempotent and closes neither the truth nor the Redis client.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.closed.Store(true)
		_ = s.ps.Close() // an error means it was closed already
		<-s.subDone
		s.purgeLocal()
	})
	return nil
}

func closedErr(op string) error { return fmt.Errorf("oncemill: tiered: %s: %w", op, store.ErrClosed) }

// now is the local time: monotonic nanoseconds since New (plus the skew
// tests add).
func (s *Store) now() int64 { return int64(time.Since(s.base)) + s.skew.Load() }

// truthTime estimates the truth's clock at local time t, for the times of
// a record written through, which decide nothing.
func (s *Store) truthTime(t int64) time.Time {
	if off, ok := s.truthClock.estimate(t); ok {
		return time.Unix(0, t+off)
	}
	return time.Unix(0, s.baseWall+t)
}

// maxCacheLife bounds a cached copy's life, so that deadlines stay far
// from overflowing when converted to another clock.
const maxCacheLife = 100 * 365 * 24 * time.Hour

// after is local time t plus d, saturating: a TTL meant as "forever"
// (math.MaxInt64) must not wrap into the past.
func after(t int64, d time.Duration) int64 {
	if int64(d) > math.MaxInt64-t {
		return math.MaxInt64
	}
	return t + int64(d)
}

func (s *Store) invalidateLocal(k id) {
	s.seq.Add(1)
	s.local.remove(k)
}

func (s *Store) purgeLocal() {
	s.seq.Add(1)
	s.local.purge()
}

func finished(rec *store.Record) bool {
	return rec != nil && (rec.Status == store.StatusSucceeded || rec.Status == store.StatusCachedFailure)
}

// answer is what the truth would answer for rec, a finished record: a
// replay, or a mismatch when both fingerprints are set and differ. The
// record is a copy the caller may change.
func answer(rec *store.Record, fingerprint string) store.ClaimResult {
	r := *rec
	r.Result = bytes.Clone(rec.Result)
	d := store.DecisionReplay
	if fingerprint != "" && r.Fingerprint != "" && fingerprint != r.Fingerprint {
		d = store.DecisionMismatch
	}
	return store.ClaimResult{Decision: d, Record: &r}
}

// lookup answers from the local tier, then from Redis (filling the local
// tier). seq is s.seq read before it.
func (s *Store) lookup(ctx context.Context, k id, fingerprint string, seq uint64, o op) (store.ClaimResult, bool) {
	if e := s.local.get(k, s.now()); e != nil {
		s.tel.replayed(ctx, tierLocal)
		return answer(&e.rec, fingerprint), true
	}
	rec, deadline, ok := s.redisGet(ctx, k, o)
	if !ok {
		return store.ClaimResult{}, false
	}
	s.tel.replayed(ctx, tierRedis)
	res := answer(&rec, fingerprint)
	s.fillLocal(k, rec, deadline, seq)
	return res, true
}

// fillLocal puts rec, which the caller hands over, in the local tier until
// local time deadline, MaxLocalAge at most. seq is s.seq as it was before
// rec was read: if an invalidation came since, the entry is taken out
// again (the invalidation may have missed it).
func (s *Store) fillLocal(k id, rec store.Record, deadline int64, seq uint64) {
	// Until the subscription is confirmed no invalidation reaches the
	// local tier, and the confirmation empties it anyway.
	if !s.subscribed.Load() || !s.local.fits(&rec) {
		return
	}
	now := s.now()
	if deadline <= now {
		return
	}
	s.local.add(k, &entry{rec: rec, deadline: min(deadline, now+int64(s.opts.MaxLocalAge))})
	if s.seq.Load() != seq {
		s.local.remove(k)
	}
}

// fill puts rec, which the caller hands over, in both caches, to be served
// until local time deadline at the latest. readStart is the local time at
// which the read or write of the truth that rec comes from began.
func (s *Store) fill(ctx context.Context, k id, rec store.Record, deadline int64, seq uint64, readStart int64, o op) {
	deadline = min(deadline, after(s.now(), maxCacheLife))
	s.fillLocal(k, rec, deadline, seq)
	// After the truth has answered, a cancelled delivery does not stop the
	// fill; RedisTimeout still bounds it.
	s.redisFill(context.WithoutCancel(ctx), k, &rec, deadline, readStart, o)
}

// fillFromTruth caches a finished record the truth returned, until its
// expiry by the truth's clock, converted to the local clock with the upper
// bound of the offset (so at the latest when the truth lets it go), less
// ClockMargin. Without a sample of the truth's clock it caches nothing.
func (s *Store) fillFromTruth(ctx context.Context, k id, rec *store.Record, seq uint64, readStart int64, o op) {
	hi, ok := s.truthClock.upper(s.now())
	if !ok || rec.ExpiresAt.IsZero() {
		return
	}
	r := *rec
	r.Result = bytes.Clone(rec.Result)
	s.fill(ctx, k, r, rec.ExpiresAt.UnixNano()-hi-int64(s.opts.ClockMargin), seq, readStart, o)
}

// ClaimLease implements store.Store: a finished record cached locally or in
// Redis is answered from there; everything else goes to the truth.
func (s *Store) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if s.closed.Load() {
		return store.ClaimResult{}, closedErr("begin")
	}
	if err := requests.ValidateLease(req); err != nil {
		return store.ClaimResult{}, fmt.Errorf("oncemill: tiered: begin: %w", err)
	}
	k := id{req.Scope, req.Key}
	seq := s.seq.Load()
	if res, ok := s.lookup(ctx, k, req.Fingerprint, seq, opBegin); ok {
		return res, nil
	}
	send := s.now()
	res, err := s.truth.ClaimLease(ctx, req)
	if err != nil {
		return res, err
	}
	switch res.Decision {
	case store.DecisionExecute:
		// The lease expires Lease after the truth's clock read when it
		// took the key: a free sample of that clock.
		created := res.Claim.ExpiresAt.Add(-req.LeaseDuration)
		if !res.Claim.ExpiresAt.IsZero() {
			s.truthClock.observe(sampleOffset(created.UnixNano(), send, s.now()))
		}
		s.pending.Add(pendingKey{k, res.Claim.Token}, pendingLease{fingerprint: req.Fingerprint, messageUUID: res.Claim.MessageUUID, created: created})
	case store.DecisionReplay, store.DecisionMismatch:
		if finished(res.Record) {
			s.tel.replayed(ctx, tierTruth)
			s.fillFromTruth(ctx, k, res.Record, seq, send, opBegin)
		}
	}
	return res, nil
}

// Error texts a write-through copies as they are: what store/postgres
// stores unchanged (valid UTF-8 without NUL, error kinds up to 256 bytes,
// messages up to 16 KiB). The truth rewrites other
// texts, so their records are cached from the truth's replay instead.
const (
	maxPlainKind    = 256
	maxPlainMessage = 16 << 10
)

func plainText(v string, limit int) bool {
	return len(v) <= limit && utf8.ValidString(v) && !strings.ContainsRune(v, 0)
}

// Complete implements store.Store: the truth first; then the finished
// record is written through to both caches, to expire TTL after the
// Complete was sent (the truth's record lives TTL from a moment after
// that) less ClockMargin.
func (s *Store) Complete(ctx context.Context, lease store.Claim, c store.Completion) error {
	if s.closed.Load() {
		return closedErr("complete")
	}
	k := id{lease.Scope, lease.Key}
	pk := pendingKey{k, lease.Token}
	seq := s.seq.Load()
	send := s.now()
	if err := s.truth.Complete(ctx, lease, c); err != nil {
		if errors.Is(err, store.ErrLeaseLost) {
			s.pending.Remove(pk)
		}
		return err
	}
	p, ok := s.pending.Peek(pk)
	s.pending.Remove(pk)
	if !ok || !plainText(string(c.ErrorKind), maxPlainKind) || !plainText(c.ErrorMessage, maxPlainMessage) {
		return nil
	}
	updated := s.truthTime(send)
	rec := store.Record{
		Scope: lease.Scope, Key: lease.Key, Fingerprint: p.fingerprint,
		Status: c.Status, Token: lease.Token, Attempt: lease.Attempt,
		Result: bytes.Clone(c.Result), ErrorKind: c.ErrorKind, ErrorMessage: c.ErrorMessage,
		CreatedAt: p.created, UpdatedAt: updated, ExpiresAt: updated.Add(c.TTL), MessageUUID: p.messageUUID,
	}
	s.fill(ctx, k, rec, after(send, c.TTL)-int64(s.opts.ClockMargin), seq, send, opComplete)
	return nil
}

// Release implements store.Store: the truth, then the key leaves the local
// tier and Redis (best effort: no finished record of a key can be cached
// while it is held, see the package documentation).
func (s *Store) Release(ctx context.Context, lease store.Claim, out store.Completion) error {
	if s.closed.Load() {
		return closedErr("release")
	}
	k := id{lease.Scope, lease.Key}
	err := s.truth.Release(ctx, lease, out)
	if err == nil || errors.Is(err, store.ErrLeaseLost) {
		s.pending.Remove(pendingKey{k, lease.Token})
	}
	if err != nil {
		return err
	}
	s.local.remove(k)
	s.redisForget(context.WithoutCancel(ctx), k, opRelease)
	return nil
}

// Extend implements store.Store: the truth's, which also samples its
// clock.
func (s *Store) Extend(ctx context.Context, lease store.Claim, d time.Duration) (store.Claim, error) {
	if s.closed.Load() {
		return store.Claim{}, closedErr("extend")
	}
	send := s.now()
	l, err := s.truth.Extend(ctx, lease, d)
	if err == nil && !l.ExpiresAt.IsZero() {
		s.truthClock.observe(sampleOffset(l.ExpiresAt.Add(-d).UnixNano(), send, s.now()))
	}
	return l, err
}

// Get implements store.Admin: the truth's.
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if s.closed.Load() {
		return store.Record{}, closedErr("get")
	}
	return s.truth.Get(ctx, scope, key)
}

// List implements store.Admin: the truth's.
func (s *Store) List(ctx context.Context, req store.ListRequest) (store.ListPage, error) {
	if s.closed.Load() {
		return store.ListPage{}, closedErr("list")
	}
	return s.truth.List(ctx, req)
}

// Delete implements store.Admin. It reaches every tier, or fails:
//
//  1. a tombstone replaces the key in Redis (for a minute), so that no
//     cached copy is served from Redis and no fill that read the record
//     before the delete can put it back. If Redis cannot take it, Delete
//     fails and deletes nothing: a delete that left Redis serving the
//     record would be a silent stale replay.
//  2. the truth deletes the record, only under token. When it refuses
//     (store.ErrLeaseLost, store.ErrNotFound) the record stays, and so does
//     the tombstone: Redis serves the key again after it, once a replay has
//     cached it anew.
//  3. this process's local tier drops the key, and an invalidation goes
//     out on the prefix's channel to every other store's local tier. If it
//     cannot be sent, Delete fails after the fact: the other local tiers
//     drop the key within MaxLocalAge by themselves.
func (s *Store) Delete(ctx context.Context, scope, key string, token int64) error {
	return s.deleteEverywhere(ctx, "delete", scope, key, func() error { return s.truth.Delete(ctx, scope, key, token) })
}

// deleteEverywhere runs the steps of Delete around truthDelete.
func (s *Store) deleteEverywhere(ctx context.Context, op, scope, key string, truthDelete func() error) error {
	if s.closed.Load() {
		return closedErr(op)
	}
	if key == "" {
		return fmt.Errorf("oncemill: tiered: %s: empty key: %w", op, store.ErrInvalidRequest)
	}
	k := id{scope, key}
	rctx, cancel := context.WithTimeout(ctx, s.opts.RedisTimeout)
	err := s.redis.client.Set(rctx, s.redis.key(k), tombstone, tombstoneTTL).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("oncemill: tiered: %s %q/%q: Redis did not take the tombstone, so a cached copy could outlive the delete; nothing was deleted, try again: %w", op, scope, key, err)
	}
	if err := truthDelete(); err != nil {
		return err
	}
	s.invalidateLocal(k)
	rctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), s.opts.RedisTimeout)
	err = s.redis.client.Publish(rctx, s.redis.channel, idString(k)).Err()
	cancel()
	if err != nil {
		return fmt.Errorf("oncemill: tiered: %s %q/%q: deleted from the truth and Redis, but the invalidation did not go out: other workers may replay it from their local tier for up to MaxLocalAge (%v): %w", op, scope, key, s.opts.MaxLocalAge, err)
	}
	return nil
}
