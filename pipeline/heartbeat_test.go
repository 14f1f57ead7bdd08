package pipeline_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
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

func (k *keyExtends) Extend(ctx context.Context, l store.Lease, d time.Duration) (store.Lease, error) {
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
	stage, err := pipeline.NewIdempotency(pipeline.IdempotencyConfig{
		Store: counted, Keys: keygen.UUID(), Scope: "s",
		Policy: policy.Policy{Lease: time.Minute, Heartbeat: 5 * time.Millisecond},
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
	waitFor(t, func() bool {
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
