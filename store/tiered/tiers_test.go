package tiered_test

import (
	"bytes"
	"context"
	"errors"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/tiered"
)

const scope = "tiers"

// replays reads how many replays each tier answered.
func replays(t *testing.T, m *teltest.Kit) (local, inRedis, truth int64) {
	t.Helper()
	return count(t, m, "oncemill.store.tier.replays", "tier", "local"),
		count(t, m, "oncemill.store.tier.replays", "tier", "redis"),
		count(t, m, "oncemill.store.tier.replays", "tier", "truth")
}

func wantReplays(t *testing.T, m *teltest.Kit, local, inRedis, truth int64) {
	t.Helper()
	if l, r, tr := replays(t, m); l != local || r != inRedis || tr != truth {
		t.Fatalf("replays by tier: local %d, redis %d, truth %d; want %d, %d, %d", l, r, tr, local, inRedis, truth)
	}
}

// redisValue is the raw value of (scope, key) in Redis, "" when absent.
func redisValue(t *testing.T, w *world, s *tiered.Store, key string) string {
	t.Helper()
	v, err := w.client.Get(context.Background(), s.RedisKey(scope, key)).Result()
	if errors.Is(err, redis.Nil) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// Replays are served from the nearest tier: the worker that completed a key
// from its local tier, another worker from Redis first and then from its
// own local tier; a miss everywhere from the truth.
func TestReplaysFromTheNearestTier(t *testing.T) {
	w := newWorld(t)
	ma, mb := teltest.New(t), teltest.New(t)
	a := w.store(t, tiered.Options{MeterProvider: ma.MeterProvider})
	b := w.store(t, tiered.Options{MeterProvider: mb.MeterProvider})

	l := expect(t, store.DecisionExecute, a, scope, "k", "fp").Claim
	complete(t, a, l, "result", time.Hour)

	res := expect(t, store.DecisionReplay, a, scope, "k", "fp")
	if string(res.Record.Result) != "result" || res.Record.Token != l.Token || res.Record.Attempt != 1 || res.Record.Fingerprint != "fp" {
		t.Fatalf("local replay = %+v", res.Record)
	}
	wantReplays(t, ma, 1, 0, 0)

	res = expect(t, store.DecisionReplay, b, scope, "k", "fp")
	if string(res.Record.Result) != "result" || res.Record.Token != l.Token {
		t.Fatalf("redis replay = %+v", res.Record)
	}
	wantReplays(t, mb, 0, 1, 0)
	expect(t, store.DecisionReplay, b, scope, "k", "")
	if m := expect(t, store.DecisionMismatch, b, scope, "k", "other").Record; m.Fingerprint != "fp" {
		t.Fatalf("mismatch record fingerprint = %q, want fp", m.Fingerprint)
	}
	wantReplays(t, mb, 2, 1, 0)

	// A record the caches never saw (written by the truth alone) is read
	// from the truth, then cached.
	l = expect(t, store.DecisionExecute, w.db.truth, scope, "direct", "").Claim
	complete(t, w.db.truth, l, "direct", time.Hour)
	expect(t, store.DecisionReplay, a, scope, "direct", "")
	wantReplays(t, ma, 1, 0, 1)
	expect(t, store.DecisionReplay, a, scope, "direct", "")
	wantReplays(t, ma, 2, 0, 1)
	expect(t, store.DecisionReplay, b, scope, "direct", "")
	wantReplays(t, mb, 2, 2, 0)

	// Results are copied in and out of every tier.
	res = expect(t, store.DecisionReplay, a, scope, "k", "")
	res.Record.Result[0] = 'X'
	if again := expect(t, store.DecisionReplay, a, scope, "k", ""); !bytes.Equal(again.Record.Result, []byte("result")) {
		t.Fatalf("changing a replayed result changed the cached one: %q", again.Record.Result)
	}
}

// checkBound checks that no cache of (scope, key) outlives the truth: each
// cache's remaining lifetime is read before the truth's, so "at most the
// truth's" holds however long the reads take.
func checkBound(t *testing.T, w *world, key string, stores ...*tiered.Store) {
	t.Helper()
	ttl, err := w.client.PTTL(context.Background(), stores[0].RedisKey(scope, key)).Result()
	if err != nil || ttl <= 0 {
		t.Fatalf("Redis PTTL of %q = %v, %v; want it cached", key, ttl, err)
	}
	var local []time.Duration
	for _, s := range stores {
		d, ok := s.LocalRemaining(scope, key)
		if !ok {
			t.Fatalf("%q is not in a local tier", key)
		}
		local = append(local, d)
	}
	truth, ok := w.db.remaining(t, scope, key)
	if !ok {
		t.Fatalf("the truth does not hold %q", key)
	}
	if ttl > truth {
		t.Errorf("%q: Redis keeps it %v, longer than the truth's %v", key, ttl, truth)
	}
	for i, d := range local {
		if d > truth {
			t.Errorf("%q: local tier %d keeps it %v, longer than the truth's %v", key, i, d, truth)
		}
	}
}

// A cached record never outlives its truth, and expiry stays consistent
// across the tiers: just before the truth's expiry every tier may replay,
// just after it none does.
func TestExpiryConsistentAcrossTiers(t *testing.T) {
	w := newWorld(t)
	a := w.store(t, tiered.Options{MaxLocalAge: time.Hour})
	b := w.store(t, tiered.Options{MaxLocalAge: time.Hour})

	// Written through by a; read from Redis by b.
	complete(t, a, expect(t, store.DecisionExecute, a, scope, "k", "").Claim, "r", time.Minute)
	expect(t, store.DecisionReplay, b, scope, "k", "")
	checkBound(t, w, "k", a, b)

	// Read from the truth by a (after it has seen a lease, whose expiry
	// relates the database's clock to its own), then from Redis by b.
	complete(t, w.db.truth, expect(t, store.DecisionExecute, w.db.truth, scope, "direct", "").Claim, "r", time.Minute)
	expect(t, store.DecisionReplay, a, scope, "direct", "")
	expect(t, store.DecisionReplay, b, scope, "direct", "")
	checkBound(t, w, "direct", a, b)

	w.advance(t, 59*time.Second)
	for _, key := range []string{"k", "direct"} {
		expect(t, store.DecisionReplay, a, scope, key, "")
		expect(t, store.DecisionReplay, b, scope, key, "")
	}
	w.advance(t, 2*time.Second)
	for _, key := range []string{"k", "direct"} {
		for _, s := range []*tiered.Store{a, b} {
			if d, ok := s.LocalRemaining(scope, key); ok {
				t.Errorf("%q: a local tier still serves it for %v after the truth's expiry", key, d)
			}
		}
		if v := redisValue(t, w, a, key); v != "" {
			t.Errorf("%q: Redis still holds %q after the truth's expiry", key, v)
		}
		res := expect(t, store.DecisionExecute, a, scope, key, "")
		if res.Claim.Attempt != 1 {
			t.Errorf("%q: ClaimLease after expiry = attempt %d, want 1", key, res.Claim.Attempt)
		}
		expect(t, store.DecisionHeld, b, scope, key, "")
	}
}

// A Delete reaches every tier: Redis at once (a tombstone), the local tier
// of the worker that deleted at once, and another worker's local tier by
// the invalidation it hears.
func TestDeleteReachesEveryTier(t *testing.T) {
	w := newWorld(t)
	a := w.store(t, tiered.Options{})
	b := w.store(t, tiered.Options{})
	waitSubscribed(t, a, b)

	first := expect(t, store.DecisionExecute, a, scope, "k", "").Claim
	complete(t, a, first, "r", time.Hour)
	expect(t, store.DecisionReplay, b, scope, "k", "") // b's local tier has it now
	if _, ok := b.LocalRemaining(scope, "k"); !ok {
		t.Fatal("b did not cache the record locally")
	}

	if err := a.Delete(context.Background(), scope, "k", first.Token); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.LocalRemaining(scope, "k"); ok {
		t.Error("a's local tier still serves the record after its Delete")
	}
	if v := redisValue(t, w, a, "k"); v != "T" {
		t.Errorf("Redis holds %q after the Delete, want the tombstone", v)
	}
	testenv.WaitFor(t, 10*time.Second, "b's local tier to drop the record", func() bool {
		_, ok := b.LocalRemaining(scope, "k")
		return !ok
	})
	l := expect(t, store.DecisionExecute, b, scope, "k", "").Claim
	if l.Attempt != 1 {
		t.Fatalf("ClaimLease after Delete = attempt %d, want 1", l.Attempt)
	}
	expect(t, store.DecisionHeld, a, scope, "k", "")

	// The tombstone keeps the new outcome out of Redis while it lives; the
	// local tier has it.
	complete(t, b, l, "second", time.Hour)
	if res := expect(t, store.DecisionReplay, b, scope, "k", ""); string(res.Record.Result) != "second" {
		t.Fatalf("replay after the second run = %q, want %q", res.Record.Result, "second")
	}
	if res := expect(t, store.DecisionReplay, a, scope, "k", ""); string(res.Record.Result) != "second" {
		t.Fatalf("replay after the second run = %q, want %q", res.Record.Result, "second")
	}

	// A Delete under another token deletes nothing; under the record's
	// (read with Get, as an operator does) it takes the same way.
	rec, err := a.Get(context.Background(), scope, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Delete(context.Background(), scope, "k", rec.Token+1); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Delete with another token = %v, want ErrLeaseLost", err)
	}
	if err := a.Delete(context.Background(), scope, "k", rec.Token); err != nil {
		t.Fatal(err)
	}
	testenv.WaitFor(t, 10*time.Second, "b's local tier to drop the record", func() bool {
		_, ok := b.LocalRemaining(scope, "k")
		return !ok
	})
	expect(t, store.DecisionExecute, b, scope, "k", "")
}

// An invalidation that never arrives (the subscription was down) leaves
// the other worker's local copy for MaxLocalAge at most: the exact
// guarantee of Delete across workers.
func TestLostInvalidationIsBoundedByMaxLocalAge(t *testing.T) {
	w := newWorld(t)
	a := w.store(t, tiered.Options{})
	b := w.store(t, tiered.Options{MaxLocalAge: 30 * time.Second})
	waitSubscribed(t, a, b)

	first := expect(t, store.DecisionExecute, a, scope, "k", "").Claim
	complete(t, a, first, "r", time.Hour)
	expect(t, store.DecisionReplay, b, scope, "k", "")
	if d, ok := b.LocalRemaining(scope, "k"); !ok || d > 30*time.Second {
		t.Fatalf("b's local tier keeps the record for %v (cached %v), want at most MaxLocalAge", d, ok)
	}
	b.StopInvalidations()
	if err := a.Delete(context.Background(), scope, "k", first.Token); err != nil {
		t.Fatal(err)
	}
	// Still served by b's local tier: what the documentation promises is
	// the bound, not less.
	expect(t, store.DecisionReplay, b, scope, "k", "")
	b.AdvanceLocalClock(30 * time.Second)
	expect(t, store.DecisionExecute, b, scope, "k", "")
}

// After Release and RecordRollback no tier replays the key.
func TestReleaseAndRollbackLeaveNoReplay(t *testing.T) {
	w := newWorld(t)
	a := w.store(t, tiered.Options{})
	b := w.store(t, tiered.Options{})
	ctx := context.Background()

	l := expect(t, store.DecisionExecute, a, scope, "released", "fp").Claim
	if err := a.Release(ctx, l, store.Completion{Status: store.StatusRetryable, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*tiered.Store{a, b} {
		if _, ok := s.LocalRemaining(scope, "released"); ok {
			t.Error("a local tier holds a released key")
		}
	}
	if v := redisValue(t, w, a, "released"); v != "" {
		t.Errorf("Redis holds %q for a released key", v)
	}
	if l2 := expect(t, store.DecisionExecute, b, scope, "released", "fp").Claim; l2.Attempt != 2 {
		t.Fatalf("ClaimLease after Release = attempt %d, want 2", l2.Attempt)
	}

	// The one-transaction mode: a retryable rollback caches nothing, a
	// cached failure is cached like a success.
	claim := func(s *tiered.Store, key string) store.TxResult {
		t.Helper()
		res, err := s.ClaimInTx(ctx, store.TxRequest{Scope: scope, Key: key, Fingerprint: "fp", SuccessTTL: time.Hour, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := claim(a, "rolled-back")
	if res.Decision != store.DecisionExecute {
		t.Fatalf("Claim = %v, want execute", res.Decision)
	}
	if err := res.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.RecordRollback(ctx, res.Claim, "fp", store.Completion{Status: store.StatusRetryable, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if v := redisValue(t, w, a, "rolled-back"); v != "" {
		t.Errorf("Redis holds %q for a rolled-back key", v)
	}
	res = claim(b, "rolled-back")
	if res.Decision != store.DecisionExecute || res.Claim.Attempt != 2 {
		t.Fatalf("Claim after a retryable rollback = %v attempt %d, want execute attempt 2", res.Decision, res.Claim.Attempt)
	}
	if err := res.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.RecordRollback(ctx, res.Claim, "fp", store.Completion{Status: store.StatusCachedFailure, ErrorKind: store.ErrorKindCached, ErrorMessage: "no such account", TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*tiered.Store{a, b} {
		res := claim(s, "rolled-back")
		if res.Decision != store.DecisionReplay || res.Record.Status != store.StatusCachedFailure || res.Record.ErrorMessage != "no such account" || res.Record.Attempt != 2 {
			t.Fatalf("Claim of a cached failure = %v %+v, want its replay", res.Decision, res.Record)
		}
	}
}

// A commit is cached only once the truth has it: a rolled-back claim
// leaves nothing, a committed one is replayed from the caches.
func TestCommitFillsTheCachesOnlyAfterTheCommit(t *testing.T) {
	w := newWorld(t)
	m := teltest.New(t)
	a := w.store(t, tiered.Options{MeterProvider: m.MeterProvider})
	ctx := context.Background()
	req := store.TxRequest{Scope: scope, Key: "k", Fingerprint: "fp", SuccessTTL: time.Hour, Wait: time.Second}

	res, err := a.ClaimInTx(ctx, req)
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("Claim = %v, %v", res.Decision, err)
	}
	if _, ok := a.LocalRemaining(scope, "k"); ok || redisValue(t, w, a, "k") != "" {
		t.Fatal("a claim was cached before its commit")
	}
	if err := res.Tx.Commit(ctx, []byte("out")); err != nil {
		t.Fatal(err)
	}
	checkBound(t, w, "k", a)
	again, err := a.ClaimInTx(ctx, req)
	if err != nil || again.Decision != store.DecisionReplay || string(again.Record.Result) != "out" || again.Tx != nil {
		t.Fatalf("Claim after the commit = %v %+v, %v; want a replay without a transaction", again.Decision, again.Record, err)
	}
	wantReplays(t, m, 1, 0, 0)
}

// A Redis that is down makes Delete fail and delete nothing, and every
// read fall back to the truth without an error; a Redis that stalls costs
// a read RedisTimeout at most, and then nothing for RedisBackoff.
func TestRedisDownAndStalled(t *testing.T) {
	db := newTruth(t)
	srv := startRedis(t)
	client := newClient(t, srv.addr)
	m := teltest.New(t)
	newStore := func(opts tiered.Options) *tiered.Store {
		opts.MeterProvider = m.MeterProvider
		s, err := tiered.New(db.truth, client, opts)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	}
	a := newStore(tiered.Options{})
	first := expect(t, store.DecisionExecute, a, scope, "k", "").Claim
	complete(t, a, first, "r", time.Hour)

	// Stalled: a fresh store (empty local tier) times out on Redis and
	// asks the truth.
	srv.signal(t, syscall.SIGSTOP)
	c := newStore(tiered.Options{RedisTimeout: 20 * time.Millisecond, RedisBackoff: time.Hour})
	for range 3 {
		expect(t, store.DecisionReplay, c, scope, "k", "")
	}
	srv.signal(t, syscall.SIGCONT)
	if n := count(t, m, "oncemill.store.tier.fallbacks", "operation", "begin"); n != 3 {
		t.Fatalf("%d begin fallbacks, want 3 (one timeout, then two skipped in the backoff)", n)
	}

	srv.kill()
	if err := a.Delete(context.Background(), scope, "k", first.Token); err == nil {
		t.Fatal("Delete with Redis down succeeded")
	}
	if _, err := a.Get(context.Background(), scope, "k"); err != nil {
		t.Fatalf("the failed Delete deleted the record: Get = %v", err)
	}
	d := newStore(tiered.Options{})
	for _, s := range []*tiered.Store{a, d} {
		expect(t, store.DecisionReplay, s, scope, "k", "")
	}
	l := expect(t, store.DecisionExecute, d, scope, "new", "").Claim
	complete(t, d, l, "r", time.Hour)
	expect(t, store.DecisionReplay, d, scope, "new", "") // from d's local tier
}

func TestOptions(t *testing.T) {
	db := newTruth(t)
	client := newClient(t, testenv.RedisAddr())
	for name, opts := range map[string]tiered.Options{
		"prefix with a space":   {Prefix: "a b"},
		"prefix with a brace":   {Prefix: "a{b}"},
		"negative record bytes": {LocalMaxRecordBytes: -1},
		"negative local age":    {MaxLocalAge: -time.Second},
		"tiny Redis timeout":    {RedisTimeout: time.Microsecond},
		"tiny clock margin":     {ClockMargin: time.Microsecond},
	} {
		if _, err := tiered.New(db.truth, client, opts); !errors.Is(err, oncemill.ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", name, err)
		}
	}
	if _, err := tiered.New(nil, client, tiered.Options{}); !errors.Is(err, oncemill.ErrInvalidConfig) {
		t.Errorf("New without a truth = %v, want ErrInvalidConfig", err)
	}
	if _, err := tiered.New(db.truth, nil, tiered.Options{}); !errors.Is(err, oncemill.ErrInvalidConfig) {
		t.Errorf("New without a cache = %v, want ErrInvalidConfig", err)
	}
	unbounded := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	defer unbounded.Close()
	if _, err := tiered.New(db.truth, unbounded, tiered.Options{}); !errors.Is(err, oncemill.ErrInvalidConfig) {
		t.Errorf("New with a client that ignores context deadlines = %v, want ErrInvalidConfig", err)
	}

	s, err := tiered.New(db.truth, client, tiered.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Limits() != db.truth.Limits() {
		t.Errorf("Limits = %+v, want the truth's %+v", s.Limits(), db.truth.Limits())
	}
	s.Close()
	s.Close()
	if _, err := s.ClaimLease(context.Background(), store.LeaseRequest{Scope: scope, Key: "k", LeaseDuration: time.Minute}); !errors.Is(err, store.ErrClosed) {
		t.Errorf("ClaimLease after Close = %v, want ErrClosed", err)
	}
}
