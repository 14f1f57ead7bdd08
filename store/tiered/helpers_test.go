package tiered_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/tiered"
)

// These tests run against the real PostgreSQL and Redis (internal/testenv),
// and never skip: an unreachable server fails the run.

// truthDB is a migrated records table in a schema of the test's own,
// dropped when the test ends.
type truthDB struct {
	pool   *pgxpool.Pool
	schema string
	truth  *postgres.Store
}

func newTruth(tb testing.TB) *truthDB {
	tb.Helper()
	pool := testenv.Pool(tb)
	schema := testenv.Schema(tb, pool)
	st, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.Migrate(ctx); err != nil {
		tb.Fatalf("Migrate: %v", err)
	}
	return &truthDB{pool: pool, schema: schema, truth: st}
}

// advance moves every stored time of the table d earlier, which the
// truth cannot tell apart from d passing on the database clock.
func (db *truthDB) advance(tb testing.TB, d time.Duration) {
	tb.Helper()
	_, err := db.pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %s SET
		purge_at = purge_at - $1 * interval '1 microsecond',
		expires_at = expires_at - $1 * interval '1 microsecond',
		created_at = created_at - $1 * interval '1 microsecond',
		updated_at = updated_at - $1 * interval '1 microsecond',
		retry_at = retry_at - $1 * interval '1 microsecond'`, pgx.Identifier{db.schema, "oncemill_records"}.Sanitize()), d.Microseconds())
	if err != nil {
		tb.Fatalf("advancing the database clock by %v: %v", d, err)
	}
}

// remaining is how long the truth still keeps (scope, key), by the
// database clock; ok is false when it holds no unexpired record.
func (db *truthDB) remaining(tb testing.TB, scope, key string) (time.Duration, bool) {
	tb.Helper()
	var us int64
	err := db.pool.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT (extract(epoch FROM expires_at - now()) * 1000000)::bigint FROM %s WHERE scope = $1 AND key = $2`,
		pgx.Identifier{db.schema, "oncemill_records"}.Sanitize()), scope, key).Scan(&us)
	if err == pgx.ErrNoRows || err == nil && us <= 0 {
		return 0, false
	}
	if err != nil {
		tb.Fatal(err)
	}
	return time.Duration(us) * time.Microsecond, true
}

func newClient(tb testing.TB, addr string) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		tb.Fatalf("Redis at %s is unreachable (%v); start it with: %s", addr, err, testenv.StartRedis)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// testPrefix returns a prefix no other run uses, and removes every key
// under it when the test ends.
func testPrefix(tb testing.TB, c *redis.Client) string {
	tb.Helper()
	prefix := "oncemilltest-tiered:" + rand.Text()[:12]
	tb.Cleanup(func() {
		ctx := context.Background()
		for _, k := range redisKeys(tb, c, prefix) {
			c.Unlink(ctx, k)
		}
	})
	return prefix
}

func redisKeys(tb testing.TB, c *redis.Client, prefix string) []string {
	tb.Helper()
	var keys []string
	ctx := context.Background()
	iter := c.Scan(ctx, 0, prefix+":*", 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		tb.Errorf("listing the keys under %q: %v", prefix, err)
	}
	return keys
}

// advanceRedis takes d off the TTL of every key under prefix, deleting
// those that run out: Redis cannot tell it from d passing.
func advanceRedis(tb testing.TB, c *redis.Client, prefix string, d time.Duration) {
	tb.Helper()
	ctx := context.Background()
	for _, k := range redisKeys(tb, c, prefix) {
		ttl, err := c.PTTL(ctx, k).Result()
		if err != nil {
			tb.Fatal(err)
		}
		switch {
		case ttl < 0: // gone meanwhile, or no TTL (not a key of the store)
		case ttl <= d:
			c.Del(ctx, k)
		default:
			c.PExpire(ctx, k, ttl-d)
		}
	}
}

// world is a truth, a Redis and tiered stores over them sharing a prefix.
type world struct {
	db     *truthDB
	client *redis.Client
	prefix string
	stores []*tiered.Store
}

func newWorld(tb testing.TB) *world {
	tb.Helper()
	c := newClient(tb, testenv.RedisAddr())
	return &world{db: newTruth(tb), client: c, prefix: testPrefix(tb, c)}
}

// store builds a tiered store of the world with opts (Prefix filled in).
// Its RedisTimeout is 5 s unless opts sets one: these tests count which
// tier answered, and a loaded machine must not turn a slow Redis reply
// into a fallback.
func (w *world) store(tb testing.TB, opts tiered.Options) *tiered.Store {
	tb.Helper()
	if opts.Prefix == "" {
		opts.Prefix = w.prefix
	}
	if opts.RedisTimeout == 0 {
		opts.RedisTimeout = 5 * time.Second
	}
	s, err := tiered.New(w.db.truth, w.client, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Close() })
	// The local tier fills only once invalidations are heard: wait for
	// that, so that the tests see it from the first call.
	for deadline := time.Now().Add(10 * time.Second); !s.Subscribed(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			tb.Fatal("the tiered store did not subscribe to invalidations within 10s")
		}
	}
	w.stores = append(w.stores, s)
	return s
}

// advance moves time forward by d in every tier of every store: the
// truth's deadlines, Redis's TTLs, and the local tiers' clocks.
func (w *world) advance(tb testing.TB, d time.Duration) {
	tb.Helper()
	w.db.advance(tb, d)
	advanceRedis(tb, w.client, w.prefix, d)
	for _, s := range w.stores {
		s.AdvanceLocalClock(d)
	}
}

func waitSubscribed(tb testing.TB, stores ...*tiered.Store) {
	tb.Helper()
	for _, s := range stores {
		testenv.WaitFor(tb, 10*time.Second, "the subscription to invalidations", s.Subscribed)
	}
}

// redisServer is a redis-server of the test's own, on a free port.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
	once sync.Once
}

func startRedis(tb testing.TB) *redisServer {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	l.Close()
	cmd := exec.Command("redis-server", "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		tb.Fatalf("starting redis-server (apt-get install redis-server): %v", err)
	}
	srv := &redisServer{addr: "127.0.0.1:" + port, cmd: cmd}
	tb.Cleanup(func() { srv.kill() })
	c := redis.NewClient(&redis.Options{Addr: srv.addr})
	defer c.Close()
	testenv.WaitFor(tb, 10*time.Second, "redis-server on port "+port, func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
	return srv
}

// kill ends the server at once (SIGKILL), as a crash would.
func (r *redisServer) kill() {
	r.once.Do(func() {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
	})
}

func (r *redisServer) signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	if err := r.cmd.Process.Signal(sig); err != nil {
		tb.Fatal(err)
	}
}

// count sums the int64 counter name of m over the points whose attribute
// key is value (every point when key is "").
func count(tb testing.TB, m *teltest.Kit, name, key, value string) int64 {
	tb.Helper()
	return teltest.Sums(tb, m.Metrics(tb), name, key)[value]
}

// begin calls ClaimLease with a minute's lease and fails the test on an error.
func begin(tb testing.TB, s store.Store, scope, key, fp string) store.ClaimResult {
	tb.Helper()
	res, err := s.ClaimLease(context.Background(), store.LeaseRequest{Scope: scope, Key: key, Fingerprint: fp, LeaseDuration: time.Minute})
	if err != nil {
		tb.Fatalf("Begin(%q): %v", key, err)
	}
	return res
}

func expect(tb testing.TB, want store.Decision, s store.Store, scope, key, fp string) store.ClaimResult {
	tb.Helper()
	res := begin(tb, s, scope, key, fp)
	if res.Decision != want {
		tb.Fatalf("Begin(%q) = %v, want %v (record %+v)", key, res.Decision, want, res.Record)
	}
	return res
}

func complete(tb testing.TB, s store.Store, l store.Claim, result string, ttl time.Duration) {
	tb.Helper()
	if err := s.Complete(context.Background(), l, store.Completion{Status: store.StatusSucceeded, Result: []byte(result), TTL: ttl}); err != nil {
		tb.Fatalf("Complete(%q): %v", l.Key, err)
	}
}

// quietRedisLog drops go-redis's own log lines: the tests that kill or stall
// Redis would print one per failed dial.
type quietRedisLog struct{}

func (quietRedisLog) Printf(context.Context, string, ...any) {}

func init() { redis.SetLogger(quietRedisLog{}) }
