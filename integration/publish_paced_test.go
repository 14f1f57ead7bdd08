package integration

import (
	"strconv"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
)

// publishPaced publishes msgs in batches evenly spread over d, msgs[i]
// to topic(i), and after it the messages then(i) returns (duplicates,
// say; then may be nil); the channel closes when all are published or a
// publish failed (a test error).
func (h *harness) publishPaced(msgs []*message.Message, batches int, d time.Duration, topic func(i int) string, then func(i int) []*message.Message) <-chan struct{} {
	t := h.t
	done := make(chan struct{})
	go func() {
		defer close(done)
		per := max(len(msgs)/batches, 1)
		tick := time.NewTicker(d / time.Duration(batches))
		defer tick.Stop()
		publish := func(topic string, m *message.Message) bool {
			if err := h.pub.Publish(topic, m); err != nil {
				t.Errorf("publishing to %s: %v", topic, err)
				return false
			}
			return true
		}
		for i, m := range msgs {
			if !publish(topic(i), m) {
				return
			}
			if then != nil {
				for _, extra := range then(i) {
					if !publish(topic(i), extra) {
						return
					}
				}
			}
			if (i+1)%per == 0 {
				<-tick.C
			}
		}
	}()
	return done
}

// payments are the commands p-0 … p-(n-1), one charge each.
func payments(t *testing.T, n int) []*message.Message {
	out := make([]*message.Message, n)
	for i := range out {
		out[i] = newCommand(t, "p-"+strconv.Itoa(i), 1500, "", 1)
	}
	return out
}
