package oncemilltest_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/oncemilltest"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/storetest"
)

func TestDeliverTwice(t *testing.T) {
	var p payments
	b := receiver.New(newStore(t)).WithPolicy(testPolicy())
	msg := message.NewMessage("pay-1", []byte("12.00 EUR"))
	msg.Metadata.Set("tenant", "acme")

	ds := oncemilltest.DeliverTwice(t, b, p.handle, msg)
	ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
	ds.RequireExecutedOnce(t)
	ds.RequireRuns(t, 1)
	ds.RequireAllAcked(t)
	p.charges.RequireCount(t, "pay-1", 1)

	// The duplicate re-publishes the stored receipt, with its UUID.
	for i, d := range ds {
		if len(d.Messages) != 1 || d.Messages[0].UUID != "receipt-pay-1" || string(d.Messages[0].Payload) != "12.00 EUR" {
			t.Errorf("delivery %d produced %v, want the receipt", i+1, d.Messages)
		}
	}
	if ds[0].Event.Attempt != 1 || ds[0].Event.Token == 0 || ds[1].Runs != 0 {
		t.Errorf("deliveries:%s", show(ds))
	}
}

// Each delivery gets a copy of the message: the same UUID, payload,
// metadata and context, in a message of its own.
func TestDeliveriesAreCopies(t *testing.T) {
	type ctxKey struct{}
	msg := message.NewMessage("pay-2", []byte("payload"))
	msg.Metadata.Set("tenant", "acme")
	msg.SetContext(context.WithValue(context.Background(), ctxKey{}, "from the test"))
	var seen []*message.Message
	h := func(m *message.Message) ([]*message.Message, error) {
		if m.UUID != "pay-2" || string(m.Payload) != "payload" || m.Metadata.Get("tenant") != "acme" || m.Context().Value(ctxKey{}) != "from the test" {
			t.Errorf("handler got %s %q %v", m.UUID, m.Payload, m.Metadata)
		}
		seen = append(seen, m)
		return nil, policy.Retryable(errTimeout) // so that each delivery runs it
	}
	oncemilltest.DeliverTwice(t, receiver.New(newStore(t)).WithPolicy(testPolicy()), h, msg).
		RequireOutcomes(t, pipeline.OutcomeReleased, pipeline.OutcomeReleased)
	if len(seen) != 2 || seen[0] == msg || seen[1] == msg || seen[0] == seen[1] {
		t.Errorf("the handler got %p and %p for %p; want two copies", seen[0], seen[1], msg)
	}
}

func TestDeliverTwiceCachedFailure(t *testing.T) {
	var p payments
	ds := oncemilltest.DeliverTwice(t, receiver.New(newStore(t)).WithPolicy(testPolicy()), p.handle,
		message.NewMessage("pay-3", []byte("declined")))
	ds.RequireOutcomes(t, pipeline.OutcomeCachedFailure, pipeline.OutcomeCachedFailureReplayed)
	ds.RequireRuns(t, 1)
	ds.RequireAllAcked(t)
	p.charges.RequireCount(t, "pay-3", 0)
	if !errors.Is(ds[0].Event.Err, errDeclined) {
		t.Errorf("event error %v, want the decline", ds[0].Event.Err)
	}
}

// A retryable failure is nacked and runs again on each redelivery. Past
// the policy's attempts it is still nacked, without a dead letter (the
// default, policy.ExhaustedKeep); under policy.ExhaustedDrop the failure is
// cached and acked.
func TestDeliverTwiceRetryable(t *testing.T) {
	p := testPolicy()
	p.MaxAttempts = 3
	h := func(*message.Message) error { return errTimeout }
	// Four deliveries: DeliverTwice twice on one builder, whose store keeps
	// the attempts.
	fourTimes := func(b *receiver.Builder) oncemilltest.Deliveries {
		msg := message.NewMessage("pay-4", nil)
		return append(oncemilltest.DeliverTwice(t, b, oncemilltest.NoPublish(h), msg), oncemilltest.DeliverTwice(t, b, oncemilltest.NoPublish(h), msg)...)
	}
	ds := fourTimes(receiver.New(newStore(t)).WithPolicy(p))
	ds.RequireOutcomes(t, pipeline.OutcomeReleased, pipeline.OutcomeReleased, pipeline.OutcomeReleased, pipeline.OutcomeReleased)
	ds.RequireRuns(t, 4)
	for i, d := range ds {
		if d.Acked || d.Event.Exhausted != (i >= 2) {
			t.Errorf("delivery %d acked %v, exhausted %v; want nacked, exhausted from the third:%s", i+1, d.Acked, d.Event.Exhausted, show(ds))
		}
	}

	p.Exhausted = policy.ExhaustedDrop
	dropped := fourTimes(receiver.New(newStore(t)).WithPolicy(p))
	dropped.RequireOutcomes(t, pipeline.OutcomeReleased, pipeline.OutcomeReleased, pipeline.OutcomeCachedFailure, pipeline.OutcomeCachedFailureReplayed)
	dropped.RequireRuns(t, 3)
	for i, d := range dropped {
		if want := i >= 2; d.Acked != want {
			t.Errorf("ExhaustedDrop: delivery %d acked %v, want %v:%s", i+1, d.Acked, want, show(dropped))
		}
	}
	if ds[0].Err == nil || !errors.Is(ds[0].Err, errTimeout) {
		t.Errorf("first delivery returned %v, want the handler's error", ds[0].Err)
	}
}

func TestDeliverConcurrently(t *testing.T) {
	var p payments
	ds := oncemilltest.DeliverConcurrently(t, receiver.New(newStore(t)).WithPolicy(testPolicy()), p.handle,
		message.NewMessage("pay-5", []byte("1.00 EUR")), 5)
	ds.RequireOutcomes(t, pipeline.OutcomeExecuted,
		pipeline.OutcomeReplayed, pipeline.OutcomeReplayed, pipeline.OutcomeReplayed, pipeline.OutcomeReplayed)
	ds.RequireExecutedOnce(t)
	ds.RequireAllAcked(t)
	p.charges.RequireCount(t, "pay-5", 1)
	// The first execution waited for the others to reach the store: they
	// all met the key held.
	for _, d := range ds[1:] {
		if !d.Event.Contended {
			t.Errorf("a duplicate did not meet the key held:%s", show(ds))
		}
	}
}

func TestDeliverConcurrentlyHeldKeyReject(t *testing.T) {
	var p payments
	pol := testPolicy()
	pol.HeldKey = policy.HeldKeyReject
	ds := oncemilltest.DeliverConcurrently(t, receiver.New(newStore(t)).WithPolicy(pol), p.handle,
		message.NewMessage("pay-6", nil), 3)
	ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeRejected, pipeline.OutcomeRejected)
	ds.RequireExecutedOnce(t)
	p.charges.RequireCount(t, "pay-6", 1)
}

// A handler whose effect is not idempotent by itself runs twice after a
// crash in the lease mode, and its effect happens twice; one that upserts
// takes effect once.
func TestDeliverAfterCrash(t *testing.T) {
	newBuilder := func(st store.Store) *receiver.Builder { return receiver.New(st).WithPolicy(testPolicy()) }

	t.Run("naive effect", func(t *testing.T) {
		var p payments
		ds := oncemilltest.DeliverAfterCrash(t, newBuilder, p.handle, message.NewMessage("pay-7", nil))
		ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeExecuted)
		ds.RequireRuns(t, 2)
		p.charges.RequireCount(t, "pay-7", 2)

		crashed, redelivered := ds[0], ds[1]
		if !crashed.Crashed || crashed.Acked || crashed.Messages != nil || crashed.Err != nil ||
			!errors.Is(crashed.Event.Err, store.ErrClosed) || !strings.Contains(crashed.Event.Err.Error(), "the worker crashed") {
			t.Errorf("crashed delivery %s", show(ds[:1]))
		}
		if redelivered.Crashed || !redelivered.Acked || !redelivered.Event.Takeover || redelivered.Event.Attempt != 2 ||
			redelivered.Event.Token <= crashed.Event.Token || len(redelivered.Messages) != 1 {
			t.Errorf("redelivery %s", show(ds[1:]))
		}
	})

	t.Run("idempotent effect", func(t *testing.T) {
		var ledger, runs oncemilltest.Effects
		upsert := func(msg *message.Message) error {
			runs.Add(msg.UUID)
			if ledger.Count(msg.UUID) == 0 { // INSERT ... ON CONFLICT DO NOTHING
				ledger.Add(msg.UUID)
			}
			return nil
		}
		ds := oncemilltest.DeliverAfterCrash(t, newBuilder, oncemilltest.NoPublish(upsert), message.NewMessage("pay-8", nil))
		ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeExecuted)
		runs.RequireCount(t, "pay-8", 2)
		ledger.RequireCount(t, "pay-8", 1)
	})

	// The crash is between the effect and the ack: a handler that fails
	// retryably crashes the same way, and the redelivery runs it again.
	t.Run("retryable failure", func(t *testing.T) {
		var fails atomic.Int32
		h := func(*message.Message) error {
			if fails.Add(1) == 1 {
				return errTimeout
			}
			return nil
		}
		ds := oncemilltest.DeliverAfterCrash(t, newBuilder, oncemilltest.NoPublish(h), message.NewMessage("pay-9", nil))
		ds.RequireOutcomes(t, pipeline.OutcomeReleased, pipeline.OutcomeExecuted)
		if !ds[1].Event.Takeover {
			t.Errorf("the redelivery did not take the crashed lease over:%s", show(ds))
		}
	})

	// The lease is the policy's, however long: the clock is moved past it.
	t.Run("long lease", func(t *testing.T) {
		long := func(st store.Store) *receiver.Builder {
			return receiver.New(st).WithPolicy(policy.Policy{LeaseDuration: 24 * time.Hour})
		}
		start := time.Now()
		ds := oncemilltest.DeliverAfterCrash(t, long, oncemilltest.NoPublish(func(*message.Message) error { return nil }), message.NewMessage("pay-10", nil))
		ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeExecuted)
		if time.Since(start) > 10*time.Second {
			t.Errorf("took %v; the lease must expire on the manual clock", time.Since(start))
		}
	})
}

func TestDeliverAfterCrashNeedsItsStore(t *testing.T) {
	own := newStore(t)
	msg := failing(t, func(tb testing.TB) {
		oncemilltest.DeliverAfterCrash(tb, func(store.Store) *receiver.Builder { return receiver.New(own) },
			oncemilltest.NoPublish(func(*message.Message) error { return nil }), message.NewMessage("pay-11", nil))
	})
	if !strings.Contains(msg, "newBuilder must build over its st") {
		t.Errorf("reported %q", msg)
	}
}

func TestHelpersReportBadInput(t *testing.T) {
	ok := oncemilltest.NoPublish(func(*message.Message) error { return nil })
	msg := message.NewMessage("m", nil)
	for _, c := range []struct {
		name string
		run  func(tb testing.TB)
		want string
	}{
		{"invalid builder", func(tb testing.TB) {
			oncemilltest.DeliverTwice(tb, receiver.New(newStore(t)).WithScope(""), ok, msg)
		}, "building the receiver: oncemill: invalid configuration: WithScope"},
		{"nil builder", func(tb testing.TB) { oncemilltest.DeliverTwice(tb, nil, ok, msg) }, "no receiver builder"},
		{"nil handler", func(tb testing.TB) { oncemilltest.DeliverTwice(tb, receiver.New(newStore(t)), nil, msg) }, "nil handler"},
		{"nil message", func(tb testing.TB) { oncemilltest.DeliverTwice(tb, receiver.New(newStore(t)), ok, nil) }, "nil message"},
		{"no deliveries", func(tb testing.TB) {
			oncemilltest.DeliverConcurrently(tb, receiver.New(newStore(t)), ok, msg, 0)
		}, "0 deliveries"},
		{"nil newBuilder", func(tb testing.TB) { oncemilltest.DeliverAfterCrash(tb, nil, ok, msg) }, "no receiver builder"},
		{"newBuilder returns nil", func(tb testing.TB) {
			oncemilltest.DeliverAfterCrash(tb, func(store.Store) *receiver.Builder { return nil }, ok, msg)
		}, "newBuilder returned nil"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := failing(t, c.run); !strings.Contains(got, "oncemilltest: ") || !strings.Contains(got, c.want) {
				t.Errorf("reported %q, want %q", got, c.want)
			}
		})
	}
}

func TestAssertionsFail(t *testing.T) {
	var p payments
	crash := oncemilltest.DeliverAfterCrash(t, func(st store.Store) *receiver.Builder { return receiver.New(st) },
		p.handle, message.NewMessage("pay-12", nil))
	for _, c := range []struct {
		name string
		run  func(tb testing.TB)
		want string
	}{
		{"RequireOutcomes", func(tb testing.TB) {
			crash.RequireOutcomes(tb, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
		}, "outcomes [executed executed], want [executed replayed]; the deliveries:\n" +
			"\t1: executed (attempt 1, token 1), handler ran 1×, crashed before the ack\n" +
			"\t2: executed (attempt 2, token 2, takeover), handler ran 1×, acked"},
		{"RequireExecutedOnce", func(tb testing.TB) { crash.RequireExecutedOnce(tb) }, "2 deliveries executed and 0 others ran the handler"},
		{"RequireRuns", func(tb testing.TB) { crash.RequireRuns(tb, 1) }, "the handler ran 2 times, want 1"},
		{"RequireAllAcked", func(tb testing.TB) { crash.RequireAllAcked(tb) }, "delivery 1 was not acked"},
		{"RequireCount twice", func(tb testing.TB) { p.charges.RequireCount(tb, "pay-12", 1) }, `"pay-12" took effect 2 times, want 1`},
		{"RequireCount never", func(tb testing.TB) { p.charges.RequireCount(tb, "pay-13", 1) }, `"pay-13" took effect 0 times, want 1`},
		{"RequireEachOnce", func(tb testing.TB) { p.charges.RequireEachOnce(tb) }, `"pay-12" took effect 2 times, want 1`},
		{"RequireEachOnce without effects", func(tb testing.TB) { new(oncemilltest.Effects).RequireEachOnce(tb) }, "no effect at all"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := failing(t, c.run); !strings.Contains(got, "oncemilltest: "+c.want) {
				t.Errorf("reported %q, want %q", got, c.want)
			}
		})
	}
}

// The helpers leave their event handler in the builder (it has no way to
// give one back); a receiver built from it later must not write into the
// deliveries already returned.
func TestBuilderReusedAfterHelper(t *testing.T) {
	var p payments
	b := receiver.New(newStore(t)).WithPolicy(testPolicy())
	ds := oncemilltest.DeliverTwice(t, b, p.handle, message.NewMessage("pay-14", nil))
	r, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	h := r.Middleware(p.handle)
	for range 3 {
		if _, err := h(message.NewMessage("pay-15", nil)); err != nil {
			t.Fatal(err)
		}
	}
	ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
	p.charges.RequireCount(t, "pay-15", 1)

	// A later helper call on the same builder and message finds the record.
	oncemilltest.DeliverTwice(t, b, p.handle, message.NewMessage("pay-14", nil)).
		RequireOutcomes(t, pipeline.OutcomeReplayed, pipeline.OutcomeReplayed)
}

// With the retry stage, one delivery runs the handler more than once.
func TestRunsCountRetries(t *testing.T) {
	var runs atomic.Int32
	h := func(*message.Message) error {
		if runs.Add(1) < 3 {
			return errTimeout
		}
		return nil
	}
	b := receiver.New(newStore(t)).WithPolicy(testPolicy()).WithRetry(retryNow())
	ds := oncemilltest.DeliverTwice(t, b, oncemilltest.NoPublish(h), message.NewMessage("pay-16", nil))
	ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
	ds.RequireExecutedOnce(t)
	if ds[0].Runs != 3 {
		t.Errorf("first delivery ran the handler %d times, want 3:%s", ds[0].Runs, show(ds))
	}
}

func retryNow() pipeline.RetryConfig {
	return pipeline.RetryConfig{InitialInterval: time.Millisecond, RandomizationFactor: -1}
}

// What DeliverAfterCrash leaves out, played with the kit's parts: a worker
// frozen past its lease (a GC pause, a stopped VM) while a redelivery takes
// the key over. Checking the lease right before the effect keeps the woken
// worker from acting a second time.
func TestPausedWorkerChecksItsLease(t *testing.T) {
	clock := storetest.NewClock(time.Now())
	mem, err := memory.New(memory.Options{Now: clock.Now, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	newBuilder := func() *receiver.Builder {
		return receiver.New(mem).WithPolicy(policy.Policy{LeaseDuration: time.Minute, NackDelay: -1, AttemptDelay: -1})
	}

	var charges oncemilltest.Effects
	var paused atomic.Bool
	frozen, wake := make(chan struct{}), make(chan struct{})
	h := func(msg *message.Message) error {
		if paused.CompareAndSwap(false, true) {
			close(frozen)
			<-wake
		}
		if err := pipeline.CheckLease(msg.Context()); err != nil {
			return err // another delivery has the key: do nothing
		}
		charges.Add(msg.UUID)
		return nil
	}
	msg := message.NewMessage("pay-17", nil)
	late := make(chan oncemilltest.Deliveries)
	// Each worker has a builder of its own: the helpers set its event
	// handler.
	go func() { late <- oncemilltest.DeliverTwice(t, newBuilder(), oncemilltest.NoPublish(h), msg) }()
	<-frozen
	clock.Advance(2 * time.Minute) // the frozen worker's lease expires
	oncemilltest.DeliverTwice(t, newBuilder(), oncemilltest.NoPublish(h), msg).
		RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
	close(wake)
	ds := <-late
	// The woken worker's first delivery finds its lease lost and does
	// nothing; its redelivery replays the other worker's success.
	ds.RequireOutcomes(t, pipeline.OutcomeReleased, pipeline.OutcomeReplayed)
	if !errors.Is(ds[0].Err, store.ErrLeaseLost) {
		t.Errorf("the woken worker returned %v, want its lease lost", ds[0].Err)
	}
	charges.RequireCount(t, "pay-17", 1)
}
