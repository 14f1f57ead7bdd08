package redisstore_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store/redisstore"
	"github.com/oncemill/oncemill/store/storetest"
)

// newClient connects to the test Redis. An unreachable Redis fails the test:
// it is never skipped.
func newClient(tb testing.TB, opts *redis.Options) *redis.Client {
	tb.Helper()
	return connect(tb, testenv.RedisAddr(), opts, "Start Redis 7 or later with:\n  "+testenv.StartRedis)
}

// newValkeyClient connects to the test Valkey, a server with SET IFEQ:
// ONCEMILL_VALKEY_ADDR, or 127.0.0.1:6391 (scripts/valkey). An unreachable
// one fails the test: it is never skipped.
func newValkeyClient(tb testing.TB, opts *redis.Options) *redis.Client {
	tb.Helper()
	return connect(tb, cmp.Or(os.Getenv("ONCEMILL_VALKEY_ADDR"), "127.0.0.1:6391"), opts,
		"Start it with:\n  scripts/valkey start\nor point ONCEMILL_VALKEY_ADDR at a running Valkey 8.1 or Redis 8.4.")
}

func connect(tb testing.TB, addr string, opts *redis.Options, howToStart string) *redis.Client {
	tb.Helper()
	if opts == nil {
		opts = &redis.Options{}
	}
	opts.Addr = addr
	c := redis.NewClient(opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		c.Close()
		tb.Fatalf("%s is unreachable (%v).\n%s", addr, err, howToStart)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// testPrefix returns a prefix no other run uses, and removes every key under
// it when the test ends.
func testPrefix(tb testing.TB, c redis.UniversalClient) string {
	tb.Helper()
	prefix := "oncemilltest:" + rand.Text()[:12]
	tb.Cleanup(func() { removeKeys(tb, c, prefix) })
	return prefix
}

// removeKeys deletes every key under prefix, on every node.
func removeKeys(tb testing.TB, c redis.UniversalClient, prefix string) {
	tb.Helper()
	ctx := context.Background()
	node := func(ctx context.Context, n *redis.Client) error {
		var cursor uint64
		for {
			keys, next, err := n.Scan(ctx, cursor, prefix+":*", 1000).Result()
			if err != nil {
				return err
			}
			// One UNLINK per key: a cluster refuses multi-key commands
			// across slots.
			_, err = n.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range keys {
					p.Unlink(ctx, k)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	var err error
	switch c := c.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, node)
	case *redis.Client:
		err = node(ctx, c)
	}
	if err != nil {
		tb.Errorf("removing the test keys under %q: %v", prefix, err)
	}
}

// listKeys lists the keys under prefix on a single Redis.
func listKeys(tb testing.TB, c *redis.Client, prefix string) []string {
	tb.Helper()
	var keys []string
	iter := c.Scan(context.Background(), 0, prefix+":*", 1000).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		tb.Fatal(err)
	}
	return keys
}

func newStore(tb testing.TB, c redis.UniversalClient, opts redisstore.Options) *redisstore.Store {
	tb.Helper()
	s, err := redisstore.New(c, opts)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// newTestStore is newStore for the tests: with Options.AutoPipeline every
// call goes through the pipeliner, not only those beyond the first few
// under way, so that the tests cover that path.
func newTestStore(tb testing.TB, c redis.UniversalClient, opts redisstore.Options) *redisstore.Store {
	tb.Helper()
	s := newStore(tb, c, opts)
	if opts.AutoPipeline {
		redisstore.SetPipeAbove(s, 0)
	}
	return s
}

// runContract runs the contract suite over c, with or without
// Options.AutoPipeline. Each subtest has a Store on a prefix of its own, and
// Advance touches only that prefix's records: the subtests may run in
// parallel.
func runContract(t *testing.T, c redis.UniversalClient, autoPipeline bool) {
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		t.Parallel()
		s := newTestStore(t, c, redisstore.Options{Prefix: testPrefix(t, c), AutoPipeline: autoPipeline})
		return storetest.Harness{Store: s, Advance: func(d time.Duration) { redisstore.AdvanceClock(s, d) }, NativeExpiry: true}
	})
}
