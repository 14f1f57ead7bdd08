package tiered_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/oncemilltest"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/tiered"
)

// TestRedisKilledMidRun delivers a stream of messages with duplicates
// through a receiver on the tiered store, and SIGKILLs the redis-server the
// test started a third of the way through. No error reaches the caller,
// every message takes effect exactly once, and the fallbacks are counted.
// Both modes, and the lease mode with the local tier off, so that every
// cached replay before the kill is a Redis read.
func TestRedisKilledMidRun(t *testing.T) {
	for _, tt := range []struct {
		transactional bool
		opts          tiered.Options
	}{
		{false, tiered.Options{}},
		{true, tiered.Options{}},
		{false, tiered.Options{LocalCapacity: -1}},
	} {
		t.Run(fmt.Sprintf("transactional=%v/local=%v", tt.transactional, tt.opts.LocalCapacity >= 0), func(t *testing.T) {
			testRedisKilledMidRun(t, tt.transactional, tt.opts)
		})
	}
}

func testRedisKilledMidRun(t *testing.T, transactional bool, opts tiered.Options) {
	db := newTruth(t)
	srv := startRedis(t)
	client := redis.NewClient(&redis.Options{Addr: srv.addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	m := teltest.New(t)
	opts.MeterProvider = m.MeterProvider
	// A killed Redis refuses at once, so the bound only matters before the
	// kill: the default 50ms, met once on a loaded machine, backs the tier
	// off to the truth for every delivery of the first third, and no replay
	// comes from the caches before Redis dies.
	opts.RedisTimeout = time.Second
	s, err := tiered.New(db.truth, client, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	b := receiver.New(s)
	if transactional {
		b = receiver.NewTransactional(s)
	}
	r, err := b.WithScope("failover").Build()
	if err != nil {
		t.Fatal(err)
	}
	var effects oncemilltest.Effects
	h := r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		effects.Add(msg.UUID)
		return nil, nil
	})

	// Each key is delivered, a third of them twice in a row (the duplicate
	// often meets the live lease), and then every key once more.
	const keys = 300
	var stream []string
	for i := range keys {
		key := fmt.Sprintf("msg-%d", i)
		stream = append(stream, key)
		if i%3 == 0 {
			stream = append(stream, key)
		}
	}
	for i := range keys {
		stream = append(stream, fmt.Sprintf("msg-%d", i))
	}
	killAt := len(stream) / 3 // mid-run: in the first pass, with deliveries in flight

	var (
		next   atomic.Int64
		wg     sync.WaitGroup
		errMu  sync.Mutex
		errs   []error
		killed = make(chan struct{})
	)
	for range 4 {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(stream) {
					return
				}
				if i == killAt {
					srv.kill()
					close(killed)
				}
				if _, err := h(message.NewMessage(stream[i], []byte("payload of "+stream[i]))); err != nil {
					errMu.Lock()
					errs = append(errs, fmt.Errorf("delivery %d of %s: %w", i, stream[i], err))
					errMu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	<-killed

	for _, err := range errs {
		t.Error(err)
	}
	for i := range keys {
		effects.RequireCount(t, fmt.Sprintf("msg-%d", i), 1)
	}
	local, inRedis, truth := replays(t, m)
	if local+inRedis == 0 {
		t.Error("no replay came from the caches before Redis died")
	}
	if truth == 0 {
		t.Error("no replay came from the truth after Redis died")
	}
	if n := count(t, m, "oncemill.store.tier.fallbacks", "", ""); n == 0 {
		t.Error("no fallback was counted")
	}
	t.Logf("replays: local %d, redis %d, truth %d; fallbacks: begin %d, claim %d, complete %d, commit %d",
		local, inRedis, truth,
		count(t, m, "oncemill.store.tier.fallbacks", "operation", "begin"), count(t, m, "oncemill.store.tier.fallbacks", "operation", "claim"),
		count(t, m, "oncemill.store.tier.fallbacks", "operation", "complete"), count(t, m, "oncemill.store.tier.fallbacks", "operation", "commit"))
}
