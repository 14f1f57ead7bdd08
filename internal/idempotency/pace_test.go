package idempotency_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/sony/gobreaker/v2"

	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store/memory"
)

// redeliver is a broker that hands a nacked message back at once: it
// delivers uuid to the consumers in turn until one acks it, each delivery
// on a fresh context that next ends (nil: never).
func redeliver(t *testing.T, consumers []message.HandlerFunc, uuid string, deadline time.Time, next func() (context.Context, context.CancelFunc)) {
	t.Helper()
	for i := 0; ; i++ {
		if time.Now().After(deadline) {
			t.Errorf("%s: not acked by the deadline", uuid)
			return
		}
		m := msg(uuid, "x")
		ctx, cancel := context.WithCancel(t.Context())
		if next != nil {
			ctx, cancel = next()
		}
		m.SetContext(ctx)
		_, err := consumers[i%len(consumers)](m)
		cancel()
		if err == nil {
			return
		}
	}
}

// An open breaker is not an attempt: five messages arriving while gobreaker's
// defaults hold the circuit open (a minute), with the dependency down for
// longer than the attempt schedule (45 s), each run once after it closes,
// and nothing is dead-lettered.
func TestOpenBreakerSpendsNoAttempt(t *testing.T) {
	t.Parallel()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	dead := &deadLetters{}
	open, opened := make(chan struct{}), sync.Once{}
	stage, err := idempotency.NewLeased(st, idempotency.Config{
		KeyGenerator: keygen.UUID(),
		Scope:        "breaker",
		Policy:       policy.Policy{}.WithDefaults(),
		CircuitBreaker: &gobreaker.Settings{OnStateChange: func(_ string, _, to gobreaker.State) {
			if to == gobreaker.StateOpen {
				opened.Do(func() { close(open) })
			}
		}},
		DeadLetterPublisher: dead,
		DeadLetterTopic:     "dead",
	})
	if err != nil {
		t.Fatal(err)
	}
	const downFor = 56 * time.Second // past the schedule's 54 s at most
	upAt := time.Now().Add(downFor)
	var mu sync.Mutex
	runs := map[string]int{}
	handler := stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		mu.Lock()
		defer mu.Unlock()
		if time.Now().Before(upAt) {
			return nil, errors.New("ledger database unreachable")
		}
		runs[m.UUID]++
		return nil, nil
	})
	deadline := time.Now().Add(3 * time.Minute)
	var wg sync.WaitGroup
	// Six failures in a row open the circuit (gobreaker's ReadyToTrip);
	// the five arrive after.
	for _, uuid := range []string{"trip-1", "trip-2", "trip-3", "trip-4", "trip-5", "trip-6"} {
		wg.Go(func() { redeliver(t, []message.HandlerFunc{handler}, uuid, deadline, nil) })
	}
	select {
	case <-open:
	case <-time.After(10 * time.Second):
		t.Fatal("six failures did not open the circuit")
	}
	arrivals := []string{"m1", "m2", "m3", "m4", "m5"}
	for _, uuid := range arrivals {
		wg.Go(func() { redeliver(t, []message.HandlerFunc{handler}, uuid, deadline, nil) })
	}
	wg.Wait()
	for _, uuid := range arrivals {
		if runs[uuid] != 1 {
			t.Errorf("%s ran %d times after the dependency came back, want 1", uuid, runs[uuid])
		}
	}
	if n := len(dead.reasons()); n != 0 {
		t.Errorf("%d messages dead-lettered, want 0", n)
	}
}

// The pause after a retryable failure is the store's, so the attempts span
// the schedule whichever consumer runs them: here every delivery is handed
// to the next of three consumers as soon as the last one nacks or is cut
// off (its context ends 20 ms in, as a kill or a revoke would end it).
func TestAttemptsSpanTheScheduleWhicheverConsumerRunsThem(t *testing.T) {
	t.Parallel()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	dead := &deadLetters{}
	p := policy.Policy{AttemptDelay: 200 * time.Millisecond, NackDelay: -1}.WithDefaults()
	var mu sync.Mutex
	var ranAt []time.Time
	var held atomic.Int32
	consumers := make([]message.HandlerFunc, 3)
	for i := range consumers {
		stage, err := idempotency.NewLeased(st, idempotency.Config{
			KeyGenerator:        keygen.UUID(),
			Scope:               "pace",
			Policy:              p,
			DeadLetterPublisher: dead,
			DeadLetterTopic:     "dead",
			EventHandler: func(e pipeline.Event) {
				if e.Outcome == pipeline.OutcomeHeldBack {
					held.Add(1)
				}
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		consumers[i] = stage.Middleware(func(*message.Message) ([]*message.Message, error) {
			mu.Lock()
			ranAt = append(ranAt, time.Now())
			mu.Unlock()
			return nil, errors.New("ledger database unreachable")
		})
	}
	redeliver(t, consumers, "m1", time.Now().Add(30*time.Second), func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(t.Context(), 20*time.Millisecond)
	})

	if len(ranAt) != p.MaxAttempts {
		t.Fatalf("the handler ran %d times, want %d attempts", len(ranAt), p.MaxAttempts)
	}
	for i := 1; i < len(ranAt); i++ {
		nominal := min(p.AttemptDelay<<(i-1), p.MaxAttemptDelay)
		if gap := ranAt[i].Sub(ranAt[i-1]); gap < nominal*8/10 {
			t.Errorf("attempt %d ran %v after attempt %d, want at least %v (the pause %v, -20%%)", i+1, gap, i, nominal*8/10, nominal)
		}
	}
	if held.Load() == 0 {
		t.Error("no delivery was held back: the consumers did not meet the pause")
	}
	if r := dead.reasons(); len(r) != 1 || r[0] != pipeline.DeadLetterReasonAttemptsExhausted {
		t.Errorf("dead letters %v, want the exhausted message's one", r)
	}
}
