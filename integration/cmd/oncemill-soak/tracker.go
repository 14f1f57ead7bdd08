package main

// Accounting beyond the example worker's demo: the tally's takeovers and
// contended keys, and the tracker of deliveries through the broker, per
// partition (so that concurrent copies meet), with the settlements the
// handlers produced and the settlements topic received.

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/integration/internal/worker"
	"github.com/oncemill/oncemill/pipeline"
)

// tally counts the outcome of every delivery, from the events oncemill
// reports (or the baseline reports with --no-idempotency), and the
// takeovers and contended keys among them.
type tally struct {
	worker.Tally
	takeovers atomic.Int64

	// contended holds the keys a delivery found held by another running
	// delivery at least once: the duplicates that really met each other.
	mu        sync.Mutex
	contended map[string]struct{}
}

func (t *tally) record(ev pipeline.Event) {
	t.Record(ev)
	if ev.Takeover {
		t.takeovers.Add(1)
	}
	if ev.Contended {
		t.mu.Lock()
		if t.contended == nil {
			t.contended = map[string]struct{}{}
		}
		t.contended[ev.Key] = struct{}{}
		t.mu.Unlock()
	}
}

// contendedKeys is how many keys were found held by another delivery at least once.
func (t *tally) contendedKeys() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.contended)
}

// tracker follows deliveries through the broker: how many are published and
// acknowledged (per partition, for the producer's flow control), and the
// settlements the handlers produced and the settlements topic received.
// Waiters are woken by closing the changed channel, which is then replaced.
type tracker struct {
	mu        sync.Mutex
	changed   chan struct{}
	inFlight  []int // per partition: published and not yet acked
	published int
	// acked counts the publications acked: an ack of a message already
	// acked as often as it was published is the broker's own redelivery
	// (SQS after a visibility timeout, a crash), counted in extraAcks.
	acked      int
	extraAcks  int
	pubs, acks map[string]int      // per message UUID
	running    int                 // handlers running now
	produced   int                 // messages returned by acked handlers, for the settlements topic
	settled    int                 // messages received on the settlements topic
	settleIDs  map[string]struct{} // their distinct UUIDs
}

func newTracker(partitions int) *tracker {
	return &tracker{
		changed:   make(chan struct{}),
		inFlight:  make([]int, partitions),
		settleIDs: map[string]struct{}{},
		pubs:      map[string]int{},
		acks:      map[string]int{},
	}
}

// notifyLocked wakes every waiter.
func (t *tracker) notifyLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

// publishing counts a delivery of message uuid about to be published to
// partition.
func (t *tracker) publishing(partition int, uuid string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.inFlight[partition]++
	t.published++
	t.pubs[uuid]++
	t.notifyLocked()
}

// middleware sees what the router will do with a delivery on partition: a
// nil error is an ack (and the returned messages are published), an error a
// nack (the broker redelivers, so the delivery is still in flight).
func (t *tracker) middleware(partition int) message.HandlerMiddleware {
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			t.mu.Lock()
			t.running++
			t.mu.Unlock()
			msgs, err := h(msg)
			t.mu.Lock()
			defer t.mu.Unlock()
			t.running--
			if err == nil {
				if t.acks[msg.UUID] < t.pubs[msg.UUID] {
					t.acks[msg.UUID]++
					t.inFlight[partition]--
					t.acked++
				} else {
					t.extraAcks++
				}
				t.produced += len(msgs)
			}
			t.notifyLocked()
			return msgs, err
		}
	}
}

// settle counts a message received on the settlements topic.
func (t *tracker) settle(msg *message.Message) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.settled++
	t.settleIDs[msg.UUID] = struct{}{}
	t.notifyLocked()
	return nil
}

// waitFor waits until ok (called with the tracker locked) holds, limit
// passes (limit <= 0: no limit) or ctx ends. It reports whether ok held.
func (t *tracker) waitFor(ctx context.Context, limit time.Duration, ok func(t *tracker) bool) bool {
	var expired <-chan time.Time
	if limit > 0 {
		timer := time.NewTimer(limit)
		defer timer.Stop()
		expired = timer.C
	}
	for {
		t.mu.Lock()
		done, changed := ok(t), t.changed
		t.mu.Unlock()
		if done {
			return true
		}
		select {
		case <-changed:
		case <-expired:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

// done reports whether every planned delivery is published and acked, every
// produced settlement received, and no handler still runs: a handler that
// outlives the broker's redelivery of its message (an SQS visibility
// timeout) must finish before the run does.
func (t *tracker) done(deliveries int) bool {
	return t.published == deliveries && t.acked >= deliveries && t.settled >= t.produced && t.running == 0
}

// flowState is a snapshot of the tracker.
type flowState struct {
	published, acked, inFlight int
	extraAcks                  int
	produced, settled          int
	distinctSettlements        int
}

func (t *tracker) state() flowState {
	t.mu.Lock()
	defer t.mu.Unlock()
	return flowState{
		published:           t.published,
		acked:               t.acked,
		extraAcks:           t.extraAcks,
		inFlight:            t.published - t.acked,
		produced:            t.produced,
		settled:             t.settled,
		distinctSettlements: len(t.settleIDs),
	}
}
