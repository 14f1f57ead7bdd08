package oncemilltest_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/oncemilltest"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store/memory"
)

var (
	errDeclined = errors.New("card declined")
	errTimeout  = errors.New("gateway timed out")
)

// newStore returns a memory store closed when the test ends.
func newStore(t *testing.T) *memory.Store {
	t.Helper()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// payments is a handler in the style of a user's: it charges once per
// message, produces a receipt, and declines (permanently) a card it knows.
type payments struct {
	charges oncemilltest.Effects
}

func (p *payments) handle(msg *message.Message) ([]*message.Message, error) {
	if string(msg.Payload) == "declined" {
		return nil, fmt.Errorf("%s: %w", msg.UUID, errDeclined)
	}
	p.charges.Add(msg.UUID)
	return []*message.Message{message.NewMessage("receipt-"+msg.UUID, msg.Payload)}, nil
}

func testPolicy() policy.Policy {
	// No pause before a nack: a test does not wait for a broker.
	return policy.Policy{CachedErrors: []error{errDeclined}, NackDelay: -1, AttemptDelay: -1}
}

// failing runs f with a testing.TB that records failures instead of
// failing t, and returns what f reported; it fails t if f reported
// nothing. Fatalf and FailNow end f's goroutine, as they do in a test.
func failing(t *testing.T, f func(tb testing.TB)) string {
	t.Helper()
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.failed {
		t.Fatal("the assertion passed; want it to fail the test")
	}
	return strings.Join(r.logs, "\n")
}

// recorder is the testing.TB of failing. Only the methods the kit calls
// are implemented; the embedded nil TB panics on any other.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	failed bool
	logs   []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failed = true
	r.logs = append(r.logs, fmt.Sprintf(format, args...))
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Failed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed
}

func (r *recorder) FailNow() { runtime.Goexit() }

// show lists deliveries for a test's failure message.
func show(ds oncemilltest.Deliveries) string {
	var b strings.Builder
	for i, d := range ds {
		fmt.Fprintf(&b, "\n\t%d: %v (attempt %d, token %d, takeover %v), handler ran %d×, acked %v, crashed %v, err %v, event error %v",
			i+1, d.Event.Outcome, d.Event.Attempt, d.Event.Token, d.Event.Takeover, d.Runs, d.Acked, d.Crashed, d.Err, d.Event.Err)
	}
	return b.String()
}
