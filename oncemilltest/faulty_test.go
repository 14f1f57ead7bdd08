package oncemilltest_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/oncemilltest"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
)

var errDown = errors.New("connection refused")

// calls records what a FaultyStore's faults were asked, as "op n" and, for
// FailAfter, "op n after".
type calls struct {
	mu  sync.Mutex
	log []string
}

func (c *calls) add(op string, n int, after bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := fmt.Sprintf("%s %d", op, n)
	if after {
		s += " after"
	}
	c.log = append(c.log, s)
}

func (c *calls) String() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.Join(c.log, ", ")
}

// A store that cannot be reached to claim the key: nothing runs, and the
// delivery is nacked so that it comes back.
func TestFaultyStoreClaimFails(t *testing.T) {
	var p payments
	st := &oncemilltest.FaultyStore{Store: newStore(t), Fail: func(_ context.Context, op string, _ int) error {
		if op == "ClaimLease" {
			return errDown
		}
		return nil
	}}
	ds := oncemilltest.DeliverTwice(t, receiver.New(st).WithPolicy(testPolicy()), p.handle, message.NewMessage("pay-1", nil))
	ds.RequireOutcomes(t, pipeline.OutcomeStoreFailed, pipeline.OutcomeStoreFailed)
	ds.RequireRuns(t, 0)
	for _, d := range ds {
		if d.Acked || !errors.Is(d.Err, errDown) {
			t.Errorf("delivery acked %v with %v, want a nack with the injected error", d.Acked, d.Err)
		}
	}

	// The store is back: the next deliveries, by a new receiver, run.
	st.Fail = nil
	oncemilltest.DeliverTwice(t, receiver.New(st).WithPolicy(testPolicy()), p.handle, message.NewMessage("pay-1", nil)).
		RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
	p.charges.RequireOnce(t, "pay-1")
}

// The injected error names the operation and the call, and wraps the
// fault's error; the calls it lets through reach the store.
func TestFaultyStoreErrorText(t *testing.T) {
	mem := newStore(t)
	st := &oncemilltest.FaultyStore{Store: mem, Fail: func(_ context.Context, op string, n int) error {
		switch {
		case op == "ClaimLease" && n == 2:
			return errDown
		case op == "Release":
			return store.ErrLeaseLost
		}
		return nil
	}}
	ctx := t.Context()
	req := store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute}
	res, err := st.ClaimLease(ctx, req)
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("first ClaimLease: %v, %v", res.Decision, err)
	}
	_, err = st.ClaimLease(ctx, req)
	if want := "oncemill: oncemilltest: ClaimLease call 2: connection refused"; err == nil || err.Error() != want || !errors.Is(err, errDown) {
		t.Errorf("ClaimLease: %v, want %q", err, want)
	}
	if res, err := st.ClaimLease(ctx, req); err != nil || res.Decision != store.DecisionHeld {
		t.Errorf("third ClaimLease: %v, %v; want the key held by the first", res.Decision, err)
	}
	err = st.Release(ctx, res.Claim, 0)
	if want := "oncemill: oncemilltest: Release call 1: " + store.ErrLeaseLost.Error(); err == nil || err.Error() != want || !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Release: %v, want %q", err, want)
	}
	// The failed Release never reached the store: the lease is still held.
	if rec, err := mem.Get(ctx, "s", "k"); err != nil || rec.Status != store.StatusInProgress || rec.Token != res.Claim.Token {
		t.Errorf("after the failed Release: %+v, %v; want the first lease in progress", rec, err)
	}
	if st.Limits() != mem.Limits() {
		t.Errorf("Limits %+v", st.Limits())
	}
}

// Complete fails once: oncemill tries again at once, and the success is
// recorded; the duplicate is replayed.
func TestFaultyStoreCompleteFailsOnce(t *testing.T) {
	var p payments
	var seen calls
	st := &oncemilltest.FaultyStore{Store: newStore(t), Fail: func(_ context.Context, op string, n int) error {
		seen.add(op, n, false)
		if op == "Complete" && n == 1 {
			return errDown
		}
		return nil
	}}
	ds := oncemilltest.DeliverTwice(t, receiver.New(st).WithPolicy(testPolicy()), p.handle, message.NewMessage("pay-2", nil))
	ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
	ds.RequireExecutedOnce(t)
	ds.RequireAllAcked(t)
	p.charges.RequireOnce(t, "pay-2")
	if got, want := seen.String(), "ClaimLease 1, Complete 1, Complete 2, ClaimLease 2"; got != want {
		t.Errorf("calls %s, want %s", got, want)
	}
}

// Complete takes effect but its answer is lost: oncemill's retry finds the
// lease finished, the delivery is acked with the error in its event, and
// the record says succeeded, so the duplicate is replayed.
func TestFaultyStoreFailAfter(t *testing.T) {
	var p payments
	var seen calls
	st := &oncemilltest.FaultyStore{Store: newStore(t),
		Fail: func(_ context.Context, op string, n int) error {
			seen.add(op, n, false)
			return nil
		},
		FailAfter: func(_ context.Context, op string, n int) error {
			seen.add(op, n, true)
			if op == "Complete" {
				return errDown
			}
			return nil
		},
	}
	ds := oncemilltest.DeliverTwice(t, receiver.New(st).WithPolicy(testPolicy()), p.handle, message.NewMessage("pay-3", nil))
	ds.RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
	ds.RequireAllAcked(t)
	p.charges.RequireOnce(t, "pay-3")
	if !errors.Is(ds[0].Event.Err, store.ErrLeaseLost) {
		t.Errorf("event error %v, want the retried Complete's lost lease", ds[0].Event.Err)
	}
	// The retried Complete failed in the store itself (the lease was
	// finished), so FailAfter was not asked for it.
	if got, want := seen.String(), "ClaimLease 1, ClaimLease 1 after, Complete 1, Complete 1 after, Complete 2, ClaimLease 2, ClaimLease 2 after"; got != want {
		t.Errorf("calls %s, want %s", got, want)
	}
}

// An injected store.ErrLeaseLost on Extend is taken for a lost lease: the
// running handler's context is cancelled with a cause wrapping it.
func TestFaultyStoreLosesLease(t *testing.T) {
	st := &oncemilltest.FaultyStore{Store: newStore(t), Fail: func(_ context.Context, op string, _ int) error {
		if op == "Extend" {
			return store.ErrLeaseLost
		}
		return nil
	}}
	h := func(msg *message.Message) error {
		select {
		case <-msg.Context().Done():
			return context.Cause(msg.Context())
		case <-time.After(10 * time.Second):
			return errors.New("the lease was never lost")
		}
	}
	b := receiver.New(st).WithPolicy(policy.Policy{LeaseDuration: 300 * time.Millisecond, Heartbeat: 20 * time.Millisecond, NackDelay: -1, AttemptDelay: -1})
	ds := oncemilltest.DeliverTwice(t, b, oncemilltest.NoPublish(h), message.NewMessage("pay-4", nil))
	ds.RequireOutcomes(t, pipeline.OutcomeReleased, pipeline.OutcomeReleased)
	ds.RequireRuns(t, 2)
	for _, d := range ds {
		if !errors.Is(d.Err, store.ErrLeaseLost) {
			t.Errorf("handler returned %v, want the lost lease", d.Err)
		}
	}
}

// A fault that blocks holds the call until it returns: here Complete, while
// the test looks at the record still in progress.
func TestFaultyStoreBlockingFault(t *testing.T) {
	mem := newStore(t)
	held, release := make(chan struct{}), make(chan struct{})
	st := &oncemilltest.FaultyStore{Store: mem, Fail: func(ctx context.Context, op string, n int) error {
		if op != "Complete" || n != 1 {
			return nil
		}
		close(held)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}}
	done := make(chan oncemilltest.Deliveries)
	go func() {
		done <- oncemilltest.DeliverTwice(t, receiver.New(st).WithScope("pay"), oncemilltest.NoPublish(func(*message.Message) error { return nil }),
			message.NewMessage("pay-5", nil))
	}()
	<-held
	rec, err := mem.Get(t.Context(), "pay", "pay-5")
	if err != nil || rec.Status != store.StatusInProgress {
		t.Errorf("during Complete: %+v, %v; want the record in progress", rec, err)
	}
	close(release)
	(<-done).RequireOutcomes(t, pipeline.OutcomeExecuted, pipeline.OutcomeReplayed)
	if rec, err := mem.Get(t.Context(), "pay", "pay-5"); err != nil || rec.Status != store.StatusSucceeded {
		t.Errorf("after Complete: %+v, %v", rec, err)
	}
}
