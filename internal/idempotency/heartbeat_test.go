package idempotency_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// keyExtends counts the Extends of each key.
type keyExtends struct {
	store.Store
	mu sync.Mutex
	n  map[string]int
}

func (k *keyExtends) Extend(ctx context.Context, l store.Claim, d time.Duration) (store.Claim, error) {
	k.mu.Lock()
	k.n[l.Key]++
	k.mu.Unlock()
	return k.Store.Extend(ctx, l, d)
}

func (k *keyExtends) count(key string) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.n[key]
}

// More handlers at once than the stage has heartbeat slots: the ones in
// slots are beaten by the stage's goroutine, the rest by timers of their
// own, and every one of them keeps its lease alive while it runs.
func TestHeartbeatBeatsEveryRunningHandler(t *testing.T) {
	t.Parallel()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	counted := &keyExtends{Store: st, n: map[string]int{}}
	stage, err := idempotency.NewLeased(counted, idempotency.Config{
		KeyGenerator: keygen.UUID(), Scope: "s",
		Policy: policy.Policy{LeaseDuration: time.Minute, Heartbeat: 5 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	const handlers = 300 // more than the stage's slots
	var started sync.WaitGroup
	started.Add(handlers)
	release := make(chan struct{})
	h := stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		started.Done()
		<-release
		return nil, nil
	})
	var done sync.WaitGroup
	for i := range handlers {
		done.Go(func() {
			if _, err := h(msg("m"+string(rune('A'+i%26))+string(rune('a'+i/26)), "x")); err != nil {
				t.Error(err)
			}
		})
	}
	started.Wait()
	testenv.WaitFor(t, 10*time.Second, "every handler's lease to be extended twice", func() bool {
		for i := range handlers {
			if counted.count("m"+string(rune('A'+i%26))+string(rune('a'+i/26))) < 2 {
				return false
			}
		}
		return true
	})
	close(release)
	done.Wait()
	// After the handlers, no beat runs: the counts stay put.
	before := counted.count("mAa")
	time.Sleep(20 * time.Millisecond) // four heartbeat intervals
	if after := counted.count("mAa"); after != before {
		t.Fatalf("Extend ran after its handler returned: %d, then %d", before, after)
	}
}

// slowExtends answers every Extend after a pause and counts how many of one
// lease's Extends are in flight at once.
type slowExtends struct {
	store.Store
	pause             time.Duration
	inFlight, maxSeen atomic.Int32
	calls             atomic.Int32
	done              atomic.Bool  // the handler has returned
	late              atomic.Int32 // Extends that started after it did
}

func (s *slowExtends) Extend(ctx context.Context, l store.Claim, d time.Duration) (store.Claim, error) {
	n := s.inFlight.Add(1)
	defer s.inFlight.Add(-1)
	for {
		seen := s.maxSeen.Load()
		if n <= seen || s.maxSeen.CompareAndSwap(seen, n) {
			break
		}
	}
	s.calls.Add(1)
	if s.done.Load() {
		s.late.Add(1)
	}
	time.Sleep(s.pause)
	return s.Store.Extend(ctx, l, d)
}

// A store slower than the heartbeat gets one Extend at a time: beats do
// not pile up behind the one in flight (and the handler's end does not wait
// for a queue of them).
func TestHeartbeatsDoNotPileUpOnASlowStore(t *testing.T) {
	t.Parallel()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	slow := &slowExtends{Store: st, pause: 50 * time.Millisecond}
	stage, err := idempotency.NewLeased(slow, idempotency.Config{
		KeyGenerator: keygen.UUID(), Scope: "s",
		Policy: policy.Policy{LeaseDuration: time.Minute, Heartbeat: 5 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		testenv.WaitFor(t, 10*time.Second, "four heartbeat extends", func() bool { return slow.calls.Load() >= 4 })
		slow.done.Store(true)
		return nil, nil
	})
	if _, err := h(msg("m1", "x")); err != nil {
		t.Fatal(err)
	}
	if n := slow.maxSeen.Load(); n != 1 {
		t.Fatalf("%d Extends of one lease were in flight at once, want 1", n)
	}
	if n := slow.late.Load(); n > 1 {
		t.Fatalf("%d Extends started after the handler returned, want at most the one already due: beats piled up", n)
	}
}
