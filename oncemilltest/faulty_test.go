package oncemilltest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/oncemilltest"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
)

var errDown = errors.New("connection refused")

// A store that cannot be reached to claim the key: nothing runs, and the
// delivery is nacked so that it comes back.
func TestFaultyStoreBeginFails(t *testing.T) {
	var p payments
	st := oncemilltest.NewFaultyStore(newStore(t))
	st.Fail(oncemilltest.OpBegin, oncemilltest.Always(errDown))
	b := receiver.New(st).WithPolicy(testPolicy())
	ds := oncemilltest.DeliverTwice(t, b, p.handle, message.NewMessage("pay-1", nil))
	ds.RequireOutcomes(t, receiver.OutcomeStoreFailed, receiver.OutcomeStoreFailed)
	ds.RequireRuns(t, 0)
	for _, d := range ds {
		if d.Acked() || !errors.Is(d.Err, oncemilltest.ErrInjected) || !errors.Is(d.Err, errDown) {
			t.Errorf("delivery %v, want a nack with the injected error", d)
		}
	}

	// The store is back: the next delivery runs.
	st.Fail(oncemilltest.OpBegin, nil)
	oncemilltest.DeliverTwice(t, b, p.handle, message.NewMessage("pay-1", nil)).
		RequireOutcomes(t, receiver.OutcomeExecuted, receiver.OutcomeReplayed)
	p.charges.RequireOnce(t, "pay-1")
}

func TestFaultyStoreErrorText(t *testing.T) {
	st := oncemilltest.NewFaultyStore(newStore(t))
	st.Fail(oncemilltest.OpBegin, oncemilltest.Nth(2, errDown))
	st.Fail(oncemilltest.OpRelease, oncemilltest.Always(nil))
	ctx := t.Context()
	req := store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute}
	res, err := st.ClaimLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.ClaimLease(ctx, req)
	if want := "oncemill: oncemilltest: ClaimLease call 2: injected store failure: connection refused"; err == nil || err.Error() != want {
		t.Errorf("ClaimLease: %v, want %q", err, want)
	}
	if _, err := st.ClaimLease(ctx, req); err != nil {
		t.Errorf("third ClaimLease: %v", err)
	}
	err = st.Release(ctx, res.Claim, 0)
	if want := "oncemill: oncemilltest: Release call 1: injected store failure"; err == nil || err.Error() != want || !errors.Is(err, oncemilltest.ErrInjected) {
		t.Errorf("Release: %v, want %q", err, want)
	}
}

// Complete fails once: oncemill tries again at once, and the success is
// recorded; the duplicate is replayed.
func TestFaultyStoreCompleteFailsOnce(t *testing.T) {
	var p payments
	st := oncemilltest.NewFaultyStore(newStore(t))
	st.Fail(oncemilltest.OpComplete, oncemilltest.Nth(1, nil))
	ds := oncemilltest.DeliverTwice(t, receiver.New(st).WithPolicy(testPolicy()), p.handle, message.NewMessage("pay-2", nil))
	ds.RequireOutcomes(t, receiver.OutcomeExecuted, receiver.OutcomeReplayed)
	ds.RequireExecutedOnce(t)
	if got := st.Count(oncemilltest.OpComplete); got != 2 {
		t.Errorf("%d Completes, want 2 (one failed, one retried)", got)
	}

	var ops []string
	for _, c := range st.Calls() {
		ops = append(ops, string(c.Op))
		if c.Key != "pay-2" {
			t.Errorf("call %+v, want key pay-2", c)
		}
	}
	if got := strings.Join(ops, " "); got != "ClaimLease Complete Complete ClaimLease" {
		t.Errorf("calls %s", got)
	}
	calls := st.Calls()
	if calls[0].Decision != store.DecisionExecute || calls[0].Lease.Token == 0 || calls[0].N != 1 ||
		calls[1].Lease != calls[0].Lease || !errors.Is(calls[1].Err, oncemilltest.ErrInjected) ||
		calls[2].N != 2 || calls[2].Err != nil || calls[3].Decision != store.DecisionReplay {
		t.Errorf("calls %+v", calls)
	}
}

// Complete takes effect but its answer is lost: oncemill's retry finds the
// lease finished, the delivery is acked with the error in its event, and
// the record says succeeded, so the duplicate is replayed.
func TestFaultyStoreFailAfter(t *testing.T) {
	var p payments
	st := oncemilltest.NewFaultyStore(newStore(t))
	st.FailAfter(oncemilltest.OpComplete, oncemilltest.Always(errDown))
	ds := oncemilltest.DeliverTwice(t, receiver.New(st).WithPolicy(testPolicy()), p.handle, message.NewMessage("pay-3", nil))
	ds.RequireOutcomes(t, receiver.OutcomeExecuted, receiver.OutcomeReplayed)
	ds.RequireAllAcked(t)
	p.charges.RequireOnce(t, "pay-3")
	if !errors.Is(ds[0].Event.Err, store.ErrLeaseLost) {
		t.Errorf("event error %v, want the retried Complete's lost lease", ds[0].Event.Err)
	}
}

// An injected store.ErrLeaseLost on Extend is taken for a lost lease: the
// running handler's context is cancelled with a cause wrapping it.
func TestFaultyStoreLosesLease(t *testing.T) {
	st := oncemilltest.NewFaultyStore(newStore(t))
	st.Fail(oncemilltest.OpExtend, oncemilltest.Always(store.ErrLeaseLost))
	h := func(msg *message.Message) error {
		select {
		case <-msg.Context().Done():
			return context.Cause(msg.Context())
		case <-time.After(10 * time.Second):
			return errors.New("the lease was never lost")
		}
	}
	b := receiver.New(st).WithPolicy(receiver.Policy{LeaseDuration: 300 * time.Millisecond, Heartbeat: 20 * time.Millisecond, NackDelay: -1})
	ds := oncemilltest.DeliverInSequence(t, b, oncemilltest.NoPublish(h), message.NewMessage("pay-4", nil), 1)
	ds.RequireOutcomes(t, receiver.OutcomeReleased)
	if !errors.Is(ds[0].Err, store.ErrLeaseLost) {
		t.Errorf("handler returned %v, want the lost lease", ds[0].Err)
	}
}

// A Fault that blocks holds the call until it returns: here Complete, while
// the test looks at the record still in progress.
func TestFaultyStoreBlockingFault(t *testing.T) {
	mem := newStore(t)
	st := oncemilltest.NewFaultyAdminStore(mem)
	held, release := make(chan struct{}), make(chan struct{})
	st.Fail(oncemilltest.OpComplete, func(ctx context.Context, c oncemilltest.Call) error {
		close(held)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	done := make(chan oncemilltest.Deliveries)
	go func() {
		done <- oncemilltest.DeliverInSequence(t, receiver.New(st).WithScope("pay"), oncemilltest.NoPublish(func(*message.Message) error { return nil }),
			message.NewMessage("pay-5", nil), 1)
	}()
	<-held
	rec, err := st.Get(t.Context(), "pay", "pay-5")
	if err != nil || rec.Status != store.StatusInProgress {
		t.Errorf("during Complete: %+v, %v; want the record in progress", rec, err)
	}
	close(release)
	(<-done).RequireOutcomes(t, receiver.OutcomeExecuted)
	if rec, err := st.Get(t.Context(), "pay", "pay-5"); err != nil || rec.Status != store.StatusSucceeded {
		t.Errorf("after Complete: %+v, %v", rec, err)
	}
}

func TestFaultyAdminStore(t *testing.T) {
	ctx := t.Context()
	st := oncemilltest.NewFaultyAdminStore(newStore(t))
	res, err := st.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}

	st.Fail(oncemilltest.OpGet, oncemilltest.Always(nil))
	if _, err := st.Get(ctx, "s", "k"); !errors.Is(err, oncemilltest.ErrInjected) {
		t.Errorf("Get: %v, want injected", err)
	}
	st.Fail(oncemilltest.OpGet, nil)
	if rec, err := st.Get(ctx, "s", "k"); err != nil || rec.Token != res.Claim.Token {
		t.Errorf("Get: %+v, %v", rec, err)
	}
	if page, err := st.List(ctx, store.ListRequest{Scope: "s"}); err != nil || len(page.Records) != 1 {
		t.Errorf("List: %+v, %v", page, err)
	}
	st.FailAfter(oncemilltest.OpCompareAndDelete, oncemilltest.Always(errDown))
	if err := st.CompareAndDelete(ctx, "s", "k", res.Claim.Token); !errors.Is(err, errDown) {
		t.Errorf("CompareAndDelete: %v, want the lost answer", err)
	}
	if _, err := st.Get(ctx, "s", "k"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get after CompareAndDelete: %v; FailAfter must let the call take effect", err)
	}
	if err := st.Delete(ctx, "s", "k"); err != nil {
		t.Errorf("Delete: %v", err)
	}
	if n, err := st.DeleteExpired(ctx, 10); err != nil || n != 0 {
		t.Errorf("DeleteExpired: %d, %v", n, err)
	}
	want := map[oncemilltest.Op]int{
		oncemilltest.OpBegin: 1, oncemilltest.OpGet: 3, oncemilltest.OpList: 1,
		oncemilltest.OpCompareAndDelete: 1, oncemilltest.OpDelete: 1, oncemilltest.OpDeleteExpired: 1,
	}
	for op, n := range want {
		if got := st.Count(op); got != n {
			t.Errorf("Count(%s) = %d, want %d", op, got, n)
		}
	}
	if got := len(st.Calls()); got != 8 {
		t.Errorf("%d calls recorded, want 8", got)
	}
	if st.Limits() != newStore(t).Limits() {
		t.Errorf("Limits %+v", st.Limits())
	}
}

func TestFaultyStoreUnknownOp(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.HasPrefix(r.(string), "oncemill: oncemilltest: \"Commit\" is not a store operation") {
			t.Errorf("recovered %v", r)
		}
	}()
	oncemilltest.NewFaultyStore(newStore(t)).Fail("Commit", oncemilltest.Always(nil))
}
