package oncemilltest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/oncemilltest/internal/crashstore"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/storetest"
)

// Delivery is what one delivery of a message came to.
type Delivery struct {
	// Event is what oncemill decided, as WithEventHandler reports it. Its
	// Outcome is zero if the receiver reported nothing.
	Event pipeline.Event
	// Messages and Err are what the receiver returned to the router: it
	// publishes Messages, and acks the message when Err is nil, nacks it
	// otherwise.
	Messages []*message.Message
	Err      error
	// Runs counts the handler's runs in this delivery: 0 for a duplicate
	// answered from the store, more than 1 under WithRetry.
	Runs int
	// Crashed marks the first delivery of DeliverAfterCrash: its worker
	// died after the handler returned, so nothing was published or acked.
	Crashed bool
	// Acked is whether the broker counts the delivery done: the receiver
	// returned no error and the worker did not crash.
	Acked bool
}

// describe is how a failed assertion shows d.
func (d Delivery) describe() string {
	var b strings.Builder
	b.WriteString(d.Event.Outcome.String())
	if d.Event.Attempt > 0 {
		fmt.Fprintf(&b, " (attempt %d, token %d", d.Event.Attempt, d.Event.Token)
		if d.Event.Takeover {
			b.WriteString(", takeover")
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, ", handler ran %d×", d.Runs)
	switch {
	case d.Crashed:
		b.WriteString(", crashed before the ack")
	case d.Err != nil:
		fmt.Fprintf(&b, ", nacked: %v", d.Err)
	default:
		b.WriteString(", acked")
	}
	// A crashed delivery's event error is the crash itself.
	if d.Event.Err != nil && d.Event.Err != d.Err && !d.Crashed {
		fmt.Fprintf(&b, " [event error: %v]", d.Event.Err)
	}
	return b.String()
}

// Deliveries are the deliveries of one message, in the order the helper
// that made them gives.
type Deliveries []Delivery

// outcomes returns each delivery's outcome.
func (ds Deliveries) outcomes() []pipeline.Outcome {
	out := make([]pipeline.Outcome, len(ds))
	for i, d := range ds {
		out[i] = d.Event.Outcome
	}
	return out
}

// runs returns how many times the handler ran, over all the deliveries.
func (ds Deliveries) runs() int {
	n := 0
	for _, d := range ds {
		n += d.Runs
	}
	return n
}

// describe is how a failed assertion shows ds: one delivery a line.
func (ds Deliveries) describe() string {
	var b strings.Builder
	for i, d := range ds {
		fmt.Fprintf(&b, "\n\t%d: %s", i+1, d.describe())
	}
	return b.String()
}

// RequireOutcomes fails the test unless the deliveries' outcomes are want,
// in order.
func (ds Deliveries) RequireOutcomes(t testing.TB, want ...pipeline.Outcome) {
	t.Helper()
	if got := ds.outcomes(); !slices.Equal(got, want) {
		t.Fatalf("oncemilltest: outcomes %v, want %v; the deliveries:%s", got, want, ds.describe())
	}
}

// RequireExecutedOnce fails the test unless exactly one delivery executed
// the handler to success and no other delivery ran it at all: what
// oncemill promises for duplicates that do not meet a crash.
func (ds Deliveries) RequireExecutedOnce(t testing.TB) {
	t.Helper()
	executed, ranElsewhere := 0, 0
	for _, d := range ds {
		switch {
		case d.Event.Outcome == pipeline.OutcomeExecuted:
			executed++
		case d.Runs > 0:
			ranElsewhere++
		}
	}
	if executed != 1 || ranElsewhere != 0 {
		t.Fatalf("oncemilltest: %d deliveries executed and %d others ran the handler, want exactly one execution; the deliveries:%s", executed, ranElsewhere, ds.describe())
	}
}

// RequireRuns fails the test unless the handler ran n times over all the
// deliveries.
func (ds Deliveries) RequireRuns(t testing.TB, n int) {
	t.Helper()
	if got := ds.runs(); got != n {
		t.Fatalf("oncemilltest: the handler ran %d times, want %d; the deliveries:%s", got, n, ds.describe())
	}
}

// RequireAllAcked fails the test unless every delivery was acked: none
// left for the broker to deliver again.
func (ds Deliveries) RequireAllAcked(t testing.TB) {
	t.Helper()
	for i, d := range ds {
		if !d.Acked {
			t.Fatalf("oncemilltest: delivery %d was not acked; the deliveries:%s", i+1, ds.describe())
		}
	}
}

// NoPublish adapts a handler that produces no messages (what Watermill's
// AddConsumerHandler takes) to the message.HandlerFunc the helpers take.
func NoPublish(h message.NoPublishHandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		return nil, h(msg)
	}
}

// DeliverTwice delivers msg twice, one after the other, through one
// receiver built from b around h: one worker that gets the message again
// after its first delivery, acked or not, as from a broker whose ack was
// lost. Each delivery is a copy of msg (its UUID, payload, metadata and
// context), as a broker's redelivery is.
//
// The helper builds the receiver itself, with an event handler of its own
// in place of b's (a builder has one): the outcomes are in the returned
// Deliveries. That changes b, so helpers running at once (parallel tests)
// each need a builder of their own. Deliveries do not pass through a
// router, so there is no handler name to scope the keys by: they share b's
// WithScope, or the empty scope. The records stay in b's store, so a later
// delivery of the same message, by this or another helper, finds them: call
// DeliverTwice again on b for a third and fourth delivery.
func DeliverTwice(t testing.TB, b *receiver.Builder, h message.HandlerFunc, msg *message.Message) Deliveries {
	t.Helper()
	check(t, b != nil, h, msg, 2)
	w := newWorker(t, b, h, nil)
	ds := make(Deliveries, 2)
	for i := range ds {
		ds[i] = w.deliver(msg)
	}
	return ds
}

// settle is how long the first execution of DeliverConcurrently waits, once
// every delivery has started, for the others to reach the store.
const settle = 20 * time.Millisecond

// DeliverConcurrently delivers msg n times at once, through n receivers
// built from b around h and sharing its store: n workers that got the same
// message, as a broker does when a redelivery overtakes a slow first
// delivery. The deliveries are returned sorted by outcome (the order of the
// Outcome constants, executed first), since they end in no fixed order.
//
// So that the duplicates meet the key held, the first execution of h waits
// until every delivery has started, and a moment more for them to reach the
// store; they then wait for it as policy.HeldKey says. That is a strong
// nudge, not a guarantee: Event.Contended tells whether a delivery met the
// key held. What DeliverTwice says of b holds here too.
func DeliverConcurrently(t testing.TB, b *receiver.Builder, h message.HandlerFunc, msg *message.Message, n int) Deliveries {
	t.Helper()
	check(t, b != nil, h, msg, n)
	var started sync.WaitGroup
	started.Add(n)
	hold := sync.OnceFunc(func() {
		started.Wait()
		time.Sleep(settle)
	})
	workers := make([]*worker, n)
	for i := range workers {
		workers[i] = newWorker(t, b, h, hold)
	}
	ds := make(Deliveries, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, w := range workers {
		wg.Go(func() {
			<-start
			started.Done()
			ds[i] = w.deliver(msg)
		})
	}
	close(start)
	wg.Wait()
	slices.SortStableFunc(ds, func(a, b Delivery) int { return cmp.Compare(a.Event.Outcome, b.Event.Outcome) })
	return ds
}

// errCrash is what the crashed worker's store writes fail with. A dead
// process's store is closed to it (store.ErrClosed), so the receiver does
// not try the write again.
var errCrash = fmt.Errorf("the worker crashed before the outcome was recorded (%w)", store.ErrClosed)

// DeliverAfterCrash delivers msg to a worker that crashes between the
// handler's effect and the ack, and then again once the broker redelivers
// it: the crash a lease exists for. It returns both deliveries.
//
// newBuilder builds a worker's receiver over the store it is given, in the
// lease mode: receiver.New(st) with the test's policy and options. The
// helper calls it twice, for the worker that crashes and for the one that
// gets the redelivery, over one memory store on a manual clock
// (storetest.Clock).
//
// The crash: the first delivery runs h to its end, so its effect happened,
// and then every store write of that delivery fails (Complete or Release),
// as they would from a dead process; the helper marks the delivery Crashed
// and neither publishes nor acks it, whatever the receiver returned. The
// record stays in progress under the first lease. The helper then moves the
// store's clock past that lease, and the redelivery takes the key over with
// attempt 2 and runs h again (Event.Takeover). That is the lease mode's
// promise: a crash before the outcome is recorded runs the message again, so
// an effect outside the record must be idempotent by itself (an upsert, a
// unique key, the lease's fencing token passed on). The usual result is
// outcomes executed, executed, and h run twice: assert the effect, not the
// runs.
//
// What it does not cover: a worker frozen past its lease that wakes up and
// acts late (deliver from two goroutines over a memory store on a
// storetest.Clock, move the clock while the first handler is held, and call
// pipeline.CheckLease right before the effect); a crash after the outcome was
// recorded but before the ack (that is a duplicate: DeliverTwice); and the
// one-transaction mode, where a crash rolls the effect back with the claim
// (see the package documentation for testing that with PostgreSQL).
func DeliverAfterCrash(t testing.TB, newBuilder func(st store.Store) *receiver.Builder, h message.HandlerFunc, msg *message.Message) Deliveries {
	t.Helper()
	check(t, newBuilder != nil, h, msg, 1)
	clock := storetest.NewClock(time.Now())
	mem, err := memory.New(memory.Options{Now: clock.Now, CleanupInterval: -1})
	if err != nil {
		t.Fatalf("oncemilltest: DeliverAfterCrash: memory store: %v", err)
	}
	defer mem.Close()
	st := &crashstore.Store{Store: mem, Crash: errCrash}

	first := newWorker(t, build(t, newBuilder, st), h, nil)
	st.Crashing.Store(true)
	crashed := first.deliver(msg)
	st.Crashing.Store(false)
	if crashed.Event.Decision != 0 && st.Claims.Load() == 0 {
		t.Fatalf("oncemilltest: DeliverAfterCrash: the receiver decided without the store it was given; newBuilder must build over its st")
	}
	crashed.Crashed, crashed.Acked, crashed.Messages, crashed.Err = true, false, nil, nil

	// The broker redelivers; the new delivery finds the lease expired.
	if exp := leaseExpiry(t, mem); exp.After(clock.Now()) {
		clock.Advance(exp.Sub(clock.Now()) + time.Millisecond)
	}
	second := newWorker(t, build(t, newBuilder, st), h, nil)
	return Deliveries{crashed, second.deliver(msg)}
}

// leaseExpiry is the latest lease expiry of the records in progress in st,
// the crashed worker's store: when its lease is gone at the latest.
func leaseExpiry(t testing.TB, st *memory.Store) time.Time {
	t.Helper()
	var last time.Time
	req := store.ListRequest{Status: store.StatusInProgress}
	for {
		page, err := st.List(context.Background(), req)
		if err != nil {
			t.Fatalf("oncemilltest: DeliverAfterCrash: listing the leases: %v", err)
		}
		for _, rec := range page.Records {
			if rec.LeaseExpiresAt.After(last) {
				last = rec.LeaseExpiresAt
			}
		}
		if page.Next == "" {
			return last
		}
		req.After = page.Next
	}
}

func build(t testing.TB, newBuilder func(store.Store) *receiver.Builder, st store.Store) *receiver.Builder {
	t.Helper()
	b := newBuilder(st)
	if b == nil {
		t.Fatalf("oncemilltest: DeliverAfterCrash: newBuilder returned nil")
	}
	return b
}

func check(t testing.TB, builder bool, h message.HandlerFunc, msg *message.Message, n int) {
	t.Helper()
	switch {
	case !builder:
		t.Fatalf("oncemilltest: no receiver builder; pass receiver.New(st) with the test's options")
	case h == nil:
		t.Fatalf("oncemilltest: nil handler")
	case msg == nil:
		t.Fatalf("oncemilltest: nil message")
	case n < 1:
		t.Fatalf("oncemilltest: %d deliveries; deliver at least one", n)
	}
}

// worker is one receiver built for a helper, and the delivery it is
// working on.
type worker struct {
	mw message.HandlerFunc

	// mu guards cur: the builder keeps the worker's event handler after the
	// helper returns, and a receiver built from it later must not write
	// into deliveries already returned.
	mu  sync.Mutex
	cur *Delivery
}

// newWorker builds a receiver from b around h, with the worker's event
// handler. before, when set, runs before each run of h.
func newWorker(t testing.TB, b *receiver.Builder, h message.HandlerFunc, before func()) *worker {
	t.Helper()
	w := &worker{}
	r, err := b.WithEventHandler(w.event).Build()
	if err != nil {
		t.Fatalf("oncemilltest: building the receiver: %v", err)
	}
	w.mw = r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		w.mu.Lock()
		if w.cur != nil {
			w.cur.Runs++
		}
		w.mu.Unlock()
		if before != nil {
			before()
		}
		return h(msg)
	})
	return w
}

func (w *worker) event(e pipeline.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.cur != nil {
		w.cur.Event = e
	}
}

// deliver runs one delivery of a copy of msg.
func (w *worker) deliver(msg *message.Message) Delivery {
	var d Delivery
	w.mu.Lock()
	w.cur = &d
	w.mu.Unlock()
	msgs, err := w.mw(redelivery(msg))
	w.mu.Lock()
	w.cur = nil
	w.mu.Unlock()
	d.Messages, d.Err, d.Acked = msgs, err, err == nil
	return d
}

// redelivery is what a broker hands a worker for msg: a message of its own
// with the same UUID, payload, metadata and context.
func redelivery(msg *message.Message) *message.Message {
	c := msg.CopyWithContext()
	c.Payload = slices.Clone(msg.Payload)
	return c
}
