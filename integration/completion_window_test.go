package integration

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/redisstore"
)

// TestLeaseModeCompletionWindow measures how long a cut of the record
// store the lease mode spans without running a message twice. A handler
// that succeeded while the store was away has its Complete retried while
// the lease is still held by the local clock (less a tenth of the lease);
// past that it is given up and the message acked, with an error log and an
// event (Outcome Executed, Err set). A duplicate delivered after the lease
// expired then runs again.
//
// Per record store (Redis, and PostgreSQL in the lease mode, both behind an
// in-process toxiproxy proxy) and per lease (3 s with a 1 s heartbeat, and
// the default 30 s), windowMessages messages arrive every windowSpacing,
// each delivered again windowDuplicateAfter after its first delivery (the
// same UUID); the store is cut for windowCut while they flow. The handler
// books its effect in process, where the cut cannot reach.
//
// Nothing may be lost. With the 30 s lease (windowCut < 0.9 × Lease) no
// completion may be given up and no message may run twice. With the 3 s
// lease (windowCut > 0.9 × Lease) the completions under way at the cut are
// given up, and their duplicates, delivered after the lease expired, may
// run again: every message that ran twice must have as many given-up
// completions (events, and the error log) as extra runs. That backs the
// docs' row: a record store cut for N s costs no double while N is shorter
// than ~0.9 × Lease; past it, a duplicate delivered after the lease
// expires may run again, each one logged.
func TestLeaseModeCompletionWindow(t *testing.T) {
	leases := []struct {
		name   string
		policy policy.Policy
		within bool // the cut is shorter than 0.9 × Lease
	}{
		{"lease_3s", policy.Policy{LeaseDuration: 3 * time.Second, Heartbeat: time.Second}, false},
		{"lease_30s_default", policy.Policy{}, true},
	}
	var mu sync.Mutex
	var rows []string
	t.Cleanup(func() { // after every parallel subtest
		sort.Strings(rows)
		t.Logf("\n| store | lease | cut | deliveries | store failures | given-up completions | doubles | lost | all acked after the heal |\n|---|---|---|---|---|---|---|---|---|\n%s",
			strings.Join(rows, "\n"))
	})
	for _, storeName := range []string{"redis", "postgres"} {
		for _, l := range leases {
			t.Run(storeName+"/"+l.name, func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				r := runWindow(t, storeName, l.policy)
				effects := r.effectsCopy()
				r.mu.Lock()
				givenUp := r.givenUp
				logged := r.logged
				r.mu.Unlock()

				var lost, doubled, unexplained []string
				doubles, givenUpN, loggedN := 0, 0, 0
				for _, n := range givenUp {
					givenUpN += n
				}
				for _, n := range logged {
					loggedN += n
				}
				for i := range windowMessages {
					id := windowID(i)
					n := effects[id]
					switch {
					case n == 0:
						lost = append(lost, id)
					case n > 1:
						doubles += n - 1
						doubled = append(doubled, fmt.Sprintf("%s×%d", id, n))
						if n-1 > givenUp[id] || n-1 > logged[id] {
							unexplained = append(unexplained, fmt.Sprintf("%s×%d (%d completions given up, %d logged)", id, n, givenUp[id], logged[id]))
						}
					}
				}
				row := fmt.Sprintf("| %s | %s | %v | %d | %d | %d | %d | %d | %v |", storeName, l.name, windowCut, r.deliveries.Load(),
					r.storeFailures.Load(), givenUpN, doubles, len(lost), r.healTook.Round(100*time.Millisecond))
				mu.Lock()
				rows = append(rows, row)
				mu.Unlock()
				t.Logf("%s, lease %v, cut %v: %d deliveries (%d messages, each twice), %d store failures, %d across the cut, %d replays, %d held-key nacks, %d takeovers; %d completions given up (%d logged), %d doubles, %d lost; all acked %v after the heal, run %v",
					storeName, l.policy.WithDefaults().LeaseDuration, windowCut, r.deliveries.Load(), windowMessages, r.storeFailures.Load(), r.acrossCut.Load(), r.replays.Load(),
					r.heldNacks.Load(), r.takeovers.Load(), givenUpN, loggedN, doubles, len(lost), r.healTook.Round(time.Millisecond),
					time.Since(start).Round(time.Millisecond))
				if len(doubled) > 0 {
					t.Logf("ran twice: %s", strings.Join(doubled, ", "))
				}

				if len(lost) > 0 {
					t.Errorf("%d of %d messages never ran (lost), e.g. %s", len(lost), windowMessages, strings.Join(lost[:min(3, len(lost))], ", "))
				}
				if givenUpN != loggedN {
					t.Errorf("%d completions given up (events) but %d logged", givenUpN, loggedN)
				}
				// The cut reached the store when a claim failed, or when a
				// delivery begun before it returned only after the heal: its
				// Complete was retried through the cut. With the 30 s lease,
				// a slow machine can have every consumer in such a retry at
				// the cut, and then no claim is tried until the heal.
				if r.storeFailures.Load() == 0 && r.acrossCut.Load() == 0 {
					t.Errorf("no ClaimLease failed during the %v cut and no delivery begun before it waited past the heal: the cut did not reach the store", windowCut)
				}
				if l.within {
					if givenUpN > 0 {
						t.Errorf("%d completions given up although the %v cut is shorter than 0.9 × the %v lease", givenUpN, windowCut, l.policy.WithDefaults().LeaseDuration)
					}
					if doubles > 0 {
						t.Errorf("%d messages ran twice although the %v cut is shorter than 0.9 × the %v lease: %s", len(doubled), windowCut,
							l.policy.WithDefaults().LeaseDuration, strings.Join(doubled[:min(5, len(doubled))], ", "))
					}
				} else {
					if len(unexplained) > 0 {
						t.Errorf("%d messages ran more often than the given-up completions say: %s", len(unexplained), strings.Join(unexplained[:min(5, len(unexplained))], ", "))
					}
					if givenUpN == 0 {
						t.Errorf("no completion was given up although the %v cut is longer than the %v lease: the cut met no handler at work",
							windowCut, l.policy.WithDefaults().LeaseDuration)
					}
				}
			})
		}
	}
}

const (
	// windowMessages messages arrive every windowSpacing (over 4 s); the
	// cut starts windowLead after the first and lasts windowCut.
	windowMessages = 400
	windowSpacing  = 10 * time.Millisecond
	windowLead     = time.Second
	windowCut      = 4 * time.Second
	// windowDuplicateAfter is when each message is delivered again, after
	// its first delivery: past the 3 s lease, and past the heal for the
	// messages at work when the cut began.
	windowDuplicateAfter = 5 * time.Second
	// windowHandlerTime is how long the handler works: at the cut, a few
	// handlers are at work (100 messages a second × 50 ms).
	windowHandlerTime = 50 * time.Millisecond
	windowConsumers   = 8
	// windowGivenUpLog is the start of the pipeline's error log for a
	// completion given up.
	windowGivenUpLog = "Handler succeeded but the success could not be recorded while the lease was held"
)

func windowID(i int) string { return fmt.Sprintf("m-%d", i) }

// windowRun is what one run saw.
type windowRun struct {
	deliveries, storeFailures, replays, heldNacks, takeovers atomic.Int64
	// acrossCut counts the deliveries begun before the cut that returned
	// after the heal.
	acrossCut atomic.Int64
	// cutAt and healAt are when the cut began and ended (UnixNano).
	cutAt, healAt atomic.Int64

	mu      sync.Mutex
	effects map[string]int // the handler's effects, in process
	givenUp map[string]int // events Outcome Executed with Err set, per message
	logged  map[string]int // error logs of a completion given up, per message

	healTook time.Duration
}

func (r *windowRun) effectsCopy() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.effects)
}

func (r *windowRun) onEvent(e pipeline.Event) {
	r.deliveries.Add(1)
	switch e.Outcome {
	case pipeline.OutcomeStoreFailed:
		r.storeFailures.Add(1)
	case pipeline.OutcomeReplayed:
		r.replays.Add(1)
	case pipeline.OutcomeHeldKeyNacked:
		r.heldNacks.Add(1)
	}
	if e.Takeover {
		r.takeovers.Add(1)
	}
	if e.Outcome == pipeline.OutcomeExecuted && e.Err != nil {
		r.mu.Lock()
		r.givenUp[e.MessageUUID]++
		r.mu.Unlock()
	}
}

// windowLogger is a slog.Handler that counts the error logs of given-up
// completions per message.
type windowLogger struct {
	r *windowRun
}

func (l windowLogger) Enabled(_ context.Context, level slog.Level) bool {
	return level >= slog.LevelError
}

func (l windowLogger) Handle(_ context.Context, rec slog.Record) error {
	if !strings.HasPrefix(rec.Message, windowGivenUpLog) {
		return nil
	}
	var id string
	rec.Attrs(func(a slog.Attr) bool {
		if a.Key == "message_uuid" {
			id = a.Value.String()
			return false
		}
		return true
	})
	l.r.mu.Lock()
	l.r.logged[id]++
	l.r.mu.Unlock()
	return nil
}

func (l windowLogger) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l windowLogger) WithGroup(string) slog.Handler      { return l }

// windowStore is the record store of kind name in namespace ns, behind a
// proxy, with short timeouts so that a cut fails its calls fast.
func windowStore(t *testing.T, name, ns string) (store.Store, *toxiproxy.Proxy) {
	switch name {
	case "redis":
		proxy := faultProxy(t, env.redisAddr)
		// One dial attempt (go-redis makes 5 by default), no command retry.
		client := redis.NewClient(&redis.Options{Addr: proxy.Listen, DialTimeout: 500 * time.Millisecond, DialerRetries: 1,
			ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond, MaxRetries: -1})
		t.Cleanup(func() { _ = client.Close() })
		st, err := redisstore.New(client, redisstore.Options{Prefix: ns})
		must(t, err)
		t.Cleanup(func() { _ = st.Close() })
		return st, proxy
	case "postgres":
		proxy := faultProxy(t, pgUpstream(t))
		pool := proxiedPool(t, proxy, 16, 500*time.Millisecond)
		st, err := postgres.New(pool, postgres.Options{Schema: ns, StatementTimeout: 500 * time.Millisecond, CleanupInterval: -1})
		must(t, err)
		t.Cleanup(func() { _ = st.Close() })
		must(t, st.Migrate(context.Background()))
		return st, proxy
	}
	t.Fatalf("no record store %q", name)
	return nil, nil
}

// runWindow delivers the messages, and their duplicates, through the lease
// mode over the record store of kind name, cut for windowCut, until every
// delivery is acked.
func runWindow(t *testing.T, name string, p policy.Policy) *windowRun {
	var raw [5]byte
	_, _ = rand.Read(raw[:])
	ns := "it_window_" + hex.EncodeToString(raw[:])
	// Registered first, so it runs last: after the store and its pool or
	// client are closed.
	t.Cleanup(func() { storeKindNamed(t, name).cleanup(t, ns) })
	r := &windowRun{effects: map[string]int{}, givenUp: map[string]int{}, logged: map[string]int{}}

	st, proxy := windowStore(t, name, ns)
	rc, err := receiver.New(st).WithScope("window").WithPolicy(p).WithEventHandler(r.onEvent).
		WithLogger(slog.New(windowLogger{r: r})).Build()
	must(t, err)
	h := rc.Middleware(func(m *message.Message) ([]*message.Message, error) {
		time.Sleep(windowHandlerTime)
		r.mu.Lock()
		r.effects[m.UUID]++
		r.mu.Unlock()
		return nil, nil
	})

	// Each message has at most two deliveries outstanding (the first or
	// its requeue, and the duplicate), so the queue never blocks.
	queue := make(chan string, 2*windowMessages)
	go func() {
		for i := range windowMessages {
			queue <- windowID(i)
			time.Sleep(windowSpacing)
		}
	}()
	var seenMu sync.Mutex
	seen := map[string]bool{}
	var acked atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range windowConsumers {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case id := <-queue:
					seenMu.Lock()
					first := !seen[id]
					seen[id] = true
					seenMu.Unlock()
					if first { // the duplicate, 5 s after the first delivery
						time.AfterFunc(windowDuplicateAfter, func() { queue <- id })
					}
					begun := time.Now().UnixNano()
					_, err := h(message.NewMessage(id, []byte("pay")))
					if cut := r.cutAt.Load(); cut != 0 && begun < cut && r.healAt.Load() != 0 {
						r.acrossCut.Add(1)
					}
					if err != nil {
						queue <- id // requeued at once, as RabbitMQ does
						continue
					}
					if acked.Add(1) == 2*windowMessages {
						close(done)
					}
				}
			}
		})
	}
	time.Sleep(windowLead)
	r.cutAt.Store(time.Now().UnixNano())
	proxy.Stop() // every connection dropped, new ones refused
	time.Sleep(windowCut)
	must(t, proxy.Start())
	heal := time.Now()
	r.healAt.Store(heal.UnixNano())
	eventually(t, limit, func() bool { return acked.Load() >= 2*windowMessages },
		func() string { return fmt.Sprintf("%d of %d deliveries acked", acked.Load(), 2*windowMessages) })
	r.healTook = time.Since(heal)
	wg.Wait()
	return r
}
