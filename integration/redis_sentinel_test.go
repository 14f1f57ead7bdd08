package integration

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/integration/internal/sentinel"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/redisstore"
)

// failoverWait is the WAIT bound of the failover tests.
const failoverWait = 500 * time.Millisecond

// TestRedisSentinelStore: the Redis store, with WaitReplicas 1, through
// go-redis's failover client while Sentinel fails the primary over (a
// SIGKILL under load, two replicas), and through a plain client pointed at
// the primary that Sentinel names, before and after. Every record whose
// Complete returned nil is on the new primary; the failover client goes on
// without a new client.
func TestRedisSentinelStore(t *testing.T) {
	g := sentinel.Start(t, 2, 0)
	ctx := t.Context()
	fo := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinel.MasterName, SentinelAddrs: []string{g.Sentinel.Addr}})
	t.Cleanup(func() { fo.Close() })
	st, err := redisstore.New(fo, redisstore.Options{Prefix: "failover", WaitReplicas: 1, WaitTimeout: failoverWait})
	must(t, err)

	// Through a plain client at the primary Sentinel names.
	old, err := g.Primary(ctx)
	must(t, err)
	plainOnce(t, old, "before")

	// Load: claims and completions through the failover client, from 4
	// goroutines, until 200 keys have been completed after the kill.
	var (
		mu        sync.Mutex
		completed []string // keys whose Complete returned nil
		failures  atomic.Int64
		next      atomic.Int64
		killedAt  atomic.Pointer[time.Time]
		firstAt   atomic.Pointer[time.Time] // the first completion after the kill
		after     atomic.Int64
	)
	loadCtx, stop := context.WithTimeout(ctx, 60*time.Second)
	defer stop()
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for loadCtx.Err() == nil && after.Load() < 200 {
				key := "k-" + strconv.FormatInt(next.Add(1), 10)
				begun := time.Now()
				if err := claimComplete(loadCtx, st, key); err != nil {
					failures.Add(1)
					time.Sleep(20 * time.Millisecond)
					continue
				}
				mu.Lock()
				completed = append(completed, key)
				n := len(completed)
				mu.Unlock()
				// After the kill: a call begun after it (one begun before
				// may have been answered by the old primary).
				if k := killedAt.Load(); k != nil && begun.After(*k) {
					now := time.Now()
					firstAt.CompareAndSwap(nil, &now)
					after.Add(1)
				} else if k == nil && n == 300 {
					now := time.Now()
					if killedAt.CompareAndSwap(nil, &now) {
						g.Server(old).Kill()
					}
				}
			}
		})
	}
	wg.Wait()
	if killedAt.Load() == nil || after.Load() < 200 {
		t.Fatalf("the load did not get through the failover: %d completed, %d after the kill, %d failures", len(completed), after.Load(), failures.Load())
	}
	kill := *killedAt.Load()
	promoted := g.WaitFailover(t, old, 30*time.Second)
	t.Logf("failover client: %d keys completed, %d calls failed during the failover; the first completion %v after the kill; %s promoted",
		len(completed), failures.Load(), firstAt.Load().Sub(kill).Round(time.Millisecond), promoted)

	// Every acknowledged completion is on the new primary.
	var missing []string
	for _, key := range completed {
		rec, err := st.Get(ctx, "s", key)
		if err != nil || rec.Status != store.StatusSucceeded {
			missing = append(missing, fmt.Sprintf("%s (%v %v)", key, rec.Status, err))
		}
	}
	if len(missing) > 0 {
		t.Errorf("%d of %d completed records are not on the new primary: %s", len(missing), len(completed), strings.Join(missing[:min(5, len(missing))], ", "))
	}
	plainOnce(t, promoted, "after")
}

// plainOnce runs one claim and completion through a plain client at addr,
// the primary Sentinel names.
func plainOnce(t *testing.T, addr, when string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	st, err := redisstore.New(c, redisstore.Options{Prefix: "plain", WaitReplicas: 1, WaitTimeout: failoverWait})
	must(t, err)
	var lastErr error
	for range 50 { // the remaining replica may still be syncing with a new primary
		if lastErr = claimComplete(t.Context(), st, "plain-"+when); lastErr == nil {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("a plain client at the primary %s, %s the failover: %v", addr, when, lastErr)
}

func claimComplete(ctx context.Context, st *redisstore.Store, key string) error {
	res, err := st.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: 10 * time.Second, MessageUUID: key})
	if err != nil {
		return err
	}
	if res.Decision != store.DecisionExecute {
		return fmt.Errorf("claim %s: %v", key, res.Decision)
	}
	return st.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour})
}
