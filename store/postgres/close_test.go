package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

func TestClose(t *testing.T) {
	pool := newPool(t, nil)
	s := newStore(t, pool, postgres.Options{CleanupInterval: time.Millisecond})
	ctx := t.Context()
	res, err := s.Begin(ctx, store.BeginRequest{Key: "k", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	txCtx, err := s.TxManager().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer s.TxManager().Rollback(txCtx) //nolint:errcheck

	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	ops := map[string]error{}
	_, ops["Begin"] = s.Begin(ctx, store.BeginRequest{Key: "k", Lease: time.Minute})
	ops["Complete"] = s.Complete(ctx, res.Lease, store.Outcome{Status: store.StatusSucceeded, TTL: time.Minute})
	ops["CompleteInTx"] = s.CompleteInTx(txCtx, res.Lease, store.Outcome{Status: store.StatusSucceeded, TTL: time.Minute})
	ops["Release"] = s.Release(ctx, res.Lease, time.Minute)
	_, ops["Extend"] = s.Extend(ctx, res.Lease, time.Minute)
	_, ops["Get"] = s.Get(ctx, "", "k")
	ops["Delete"] = s.Delete(ctx, "", "k")
	_, ops["DeleteExpired"] = s.DeleteExpired(ctx, 10)
	_, _, ops["CleanupPass"] = s.CleanupPass(ctx)
	_, ops["TxManager.Begin"] = s.TxManager().Begin(ctx)
	for op, err := range ops {
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", op, err)
		}
	}
}

// Close runs what is already queued before it stops the workers: callers
// that got in get their answers, not ErrClosed.
func TestCloseDrainsQueuedRequests(t *testing.T) {
	pool := newPool(t, nil)
	schema := newSchema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema, BatchWorkers: 1})
	b := blockBegins(t, s, pool, schema)
	reqs := make([]store.BeginRequest, 5)
	for i := range reqs {
		reqs[i] = store.BeginRequest{Key: fmt.Sprint(i), Lease: time.Minute}
	}
	outs := enqueueBegins(t, s, reqs)

	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	select {
	case <-closed:
		t.Fatal("Close returned while a statement was still running")
	case <-time.After(50 * time.Millisecond):
	}
	b.release()
	if err := <-b.done; err != nil {
		t.Fatal(err)
	}
	for i, ch := range outs {
		if o := <-ch; o.err != nil || o.res.Decision != store.Execute {
			t.Fatalf("queued Begin %d = %v, %v; want execute", i, o.res.Decision, o.err)
		}
	}
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close did not return after the queue drained")
	}
}

// A caller that gives up stops waiting at once; others in its batch are
// unaffected.
func TestCallerContextCanceled(t *testing.T) {
	pool := newPool(t, nil)
	schema := newSchema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema, BatchWorkers: 1})
	b := blockBegins(t, s, pool, schema)

	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan error, 1)
	go func() {
		_, err := s.Begin(ctx, store.BeginRequest{Key: "gone", Lease: time.Minute})
		gone <- err
	}()
	waitFor(t, "the Begin to queue", func() bool { return s.BeginQueueLen() == 1 })
	outs := enqueueBegins(t, s, []store.BeginRequest{{Key: "stays", Lease: time.Minute}})
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Begin = %v, want context.Canceled", err)
	}
	b.release()
	if o := <-outs[0]; o.err != nil || o.res.Decision != store.Execute {
		t.Fatalf("Begin beside a canceled one = %v, %v", o.res.Decision, o.err)
	}
	// The canceled request was dropped before it reached the database.
	if _, err := s.Get(t.Context(), "", "gone"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get(gone) = %v, want ErrNotFound", err)
	}
}
