package main

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/testenv"
)

// The run ends only once every publication is acked and no handler still
// runs: a broker's own redelivery (an SQS visibility timeout running out
// while the handler stalls) is acked as well, and used to end the run
// before the stalled handler had charged its payment.
func TestTrackerIgnoresBrokerRedeliveriesAndWaitsForRunningHandlers(t *testing.T) {
	tr := newTracker(1)
	tr.publishing(0, "a")
	release := make(chan struct{})
	var calls atomic.Int32
	h := tr.middleware(0)(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 { // the stalled first delivery
			<-release
		}
		return nil, nil
	})
	stalled := make(chan struct{})
	go func() { _, _ = h(message.NewMessage("a", nil)); close(stalled) }()
	testenv.WaitFor(t, 30*time.Second, "one running delivery", func() bool { tr.mu.Lock(); defer tr.mu.Unlock(); return tr.running == 1 })
	if _, err := h(message.NewMessage("a", nil)); err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	doneEarly := tr.done(1)
	tr.mu.Unlock()
	if doneEarly {
		t.Fatal("the run would end while the first delivery still runs")
	}
	close(release)
	<-stalled
	fs := tr.state()
	if fs.acked != 1 || fs.extraAcks != 1 || fs.inFlight != 0 {
		t.Fatalf("acked %d, extra %d, in flight %d; want 1, 1, 0", fs.acked, fs.extraAcks, fs.inFlight)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if !tr.done(1) {
		t.Fatal("the run does not end once every publication is acked and nothing runs")
	}
}
