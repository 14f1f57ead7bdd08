package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// ledgerFixture is a store, a ledger table for the handler's business
// writes, and the receiver in the one-transaction mode around a handler
// that books one ledger row per message.
type ledgerFixture struct {
	pool   *pgxpool.Pool
	schema string
	s      *postgres.Store
	ledger string
	// after runs inside the transaction, after the ledger INSERT.
	after func(msg *message.Message) error
	// silent handlers produce no messages, so the commit has no result
	// to write.
	silent bool
	events chan pipeline.Event
	h      message.HandlerFunc
}

func newLedgerFixture(t *testing.T, p policy.Policy, configure ...func(*receiver.Builder)) *ledgerFixture {
	t.Helper()
	f := &ledgerFixture{pool: testenv.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 16 }), events: make(chan pipeline.Event, 1024)}
	f.schema = testenv.Schema(t, f.pool)
	f.s = newStore(t, f.pool, postgres.Options{Schema: f.schema})
	f.ledger = pgx.Identifier{f.schema, "ledger"}.Sanitize()
	if _, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.ledger+" (id bigserial PRIMARY KEY, message_uuid text NOT NULL, amount int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	p.LeaseDuration, p.Heartbeat = 0, 0 // the one-transaction mode has no lease
	b := receiver.NewTransactional(f.s).
		WithScope("ledger").
		WithPolicy(p).
		WithEventHandler(func(e pipeline.Event) { f.events <- e })
	for _, c := range configure {
		c(b)
	}
	r, err := b.Build()
	if err != nil {
		t.Fatal(err)
	}
	f.h = r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := postgres.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("handler: no transaction in the context")
		}
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+f.ledger+" (message_uuid, amount) VALUES ($1, 100)", msg.UUID); err != nil {
			return nil, err
		}
		if f.after != nil {
			if err := f.after(msg); err != nil {
				return nil, err
			}
		}
		if f.silent {
			return nil, nil
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte("booked"))}, nil
	})
	return f
}

func (f *ledgerFixture) rows(t *testing.T, uuid string) int {
	t.Helper()
	return ledgerRows(t, f.pool, f.ledger, uuid)
}

// ledgerRows counts the rows of ledger booked for the message uuid.
func ledgerRows(t *testing.T, pool *pgxpool.Pool, ledger, uuid string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+ledger+" WHERE message_uuid = $1", uuid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

func (f *ledgerFixture) deliver(uuid string) ([]*message.Message, error) {
	return f.h(message.NewMessage(uuid, []byte("pay 100")))
}

// event returns the event of the next delivery.
func (f *ledgerFixture) event(t *testing.T) pipeline.Event {
	t.Helper()
	return nextEvent(t, f.events)
}

// nextEvent is the next event on events, within 30 s.
func nextEvent(t *testing.T, events <-chan pipeline.Event) pipeline.Event {
	t.Helper()
	select {
	case e := <-events:
		return e
	case <-time.After(30 * time.Second):
		t.Fatal("no event")
		return pipeline.Event{}
	}
}

func TestTransactionalSuccessAndReplay(t *testing.T) {
	t.Parallel()
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults())
	ctx := t.Context()

	out, err := f.deliver("m-1")
	if err != nil || len(out) != 1 || out[0].UUID != "out-m-1" {
		t.Fatalf("first delivery = %v, %v", out, err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 1 || e.Token == 0 {
		t.Fatalf("first event = %+v, want executed at attempt 1 with a token", e)
	}
	if n := f.rows(t, "m-1"); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
	rec, err := f.s.Get(ctx, "ledger", "m-1")
	if err != nil || rec.Status != store.StatusSucceeded || len(rec.Result) == 0 {
		t.Fatalf("record = %v (%d result bytes), %v; want succeeded with the produced message", rec.Status, len(rec.Result), err)
	}

	// A duplicate replays the stored output, with its UUID, and writes nothing.
	out, err = f.deliver("m-1")
	if err != nil || len(out) != 1 || out[0].UUID != "out-m-1" || string(out[0].Payload) != "booked" {
		t.Fatalf("duplicate = %v, %v; want the replayed output", out, err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeReplayed {
		t.Fatalf("duplicate's outcome = %v, want replayed", e.Outcome)
	}
	if n := f.rows(t, "m-1"); n != 1 {
		t.Fatalf("%d ledger rows after the duplicate, want 1", n)
	}
}

func TestTransactionalHandlerErrorRollsBack(t *testing.T) {
	t.Parallel()
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults())
	ctx := t.Context()
	boom := errors.New("downstream timeout")
	f.after = func(*message.Message) error { return boom }

	if _, err := f.deliver("m-2"); !errors.Is(err, boom) {
		t.Fatalf("delivery = %v, want the handler's error (a nack)", err)
	}
	if n := f.rows(t, "m-2"); n != 0 {
		t.Fatalf("%d ledger rows after the failure, want 0: the INSERT must roll back", n)
	}
	rec, err := f.s.Get(ctx, "ledger", "m-2")
	if err != nil || rec.Status != store.StatusRetryable || rec.Attempt != 1 {
		t.Fatalf("record = %v attempt %d, %v; want retryable at attempt 1", rec.Status, rec.Attempt, err)
	}

	// The redelivery runs again, as attempt 2, and books once.
	f.after = nil
	if _, err := f.deliver("m-2"); err != nil {
		t.Fatal(err)
	}
	if n := f.rows(t, "m-2"); n != 1 {
		t.Fatalf("%d ledger rows after the retry, want 1", n)
	}
	if rec, err := f.s.Get(ctx, "ledger", "m-2"); err != nil || rec.Status != store.StatusSucceeded || rec.Attempt != 2 {
		t.Fatalf("record = %v attempt %d, %v; want succeeded at attempt 2", rec.Status, rec.Attempt, err)
	}
}

func TestTransactionalPanicRollsBack(t *testing.T) {
	t.Parallel()
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults())
	f.after = func(*message.Message) error { panic("handler bug") }

	if _, err := f.deliver("m-3"); err == nil {
		t.Fatal("a panicking handler's delivery succeeded")
	}
	if n := f.rows(t, "m-3"); n != 0 {
		t.Fatalf("%d ledger rows after the panic, want 0", n)
	}
	rec, err := f.s.Get(t.Context(), "ledger", "m-3")
	if err != nil || rec.Status != store.StatusRetryable {
		t.Fatalf("record = %v, %v; want retryable, not succeeded", rec.Status, err)
	}
}

// Attempts are counted across deliveries; under policy.ExhaustedDrop the
// failure of the last allowed one is cached and acked, and a permanent
// failure is cached at once.
func TestTransactionalAttemptCapAndCachedFailures(t *testing.T) {
	t.Parallel()
	p := policy.Policy{}.WithDefaults()
	p.MaxAttempts, p.Exhausted, p.AttemptDelay = 2, policy.ExhaustedDrop, -1
	f := newLedgerFixture(t, p)
	ctx := t.Context()
	f.after = func(*message.Message) error { return errors.New("still down") }

	if _, err := f.deliver("capped"); err == nil {
		t.Fatal("attempt 1: nil, want a nack")
	}
	f.event(t)
	if _, err := f.deliver("capped"); err != nil {
		t.Fatalf("attempt 2 (the last) = %v, want an ack", err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeCachedFailure || e.Attempt != 2 {
		t.Fatalf("attempt 2 = %v at attempt %d, want cached_failure at 2", e.Outcome, e.Attempt)
	}
	rec, err := f.s.Get(ctx, "ledger", "capped")
	if err != nil || rec.Status != store.StatusCachedFailure || rec.ErrorKind != store.ErrorKindAttemptsExhausted || rec.Attempt != 2 {
		t.Fatalf("record = %+v, %v; want failed, attempts_exhausted, attempt 2", rec, err)
	}
	if _, err := f.deliver("capped"); err != nil {
		t.Fatalf("a duplicate of a cached failure = %v, want an ack", err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeCachedFailureReplayed {
		t.Fatalf("duplicate = %v, want cached_failure_replayed", e.Outcome)
	}

	f.after = func(*message.Message) error { return policy.Cached(errors.New("no such account")) }
	if _, err := f.deliver("permanent"); err != nil {
		t.Fatalf("a permanent failure = %v, want an ack", err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeCachedFailure || e.Attempt != 1 {
		t.Fatalf("permanent = %v at attempt %d, want cached_failure at 1", e.Outcome, e.Attempt)
	}
	if rec, err := f.s.Get(ctx, "ledger", "permanent"); err != nil || rec.ErrorKind != store.ErrorKindCached || rec.ErrorMessage != "no such account" {
		t.Fatalf("record = %+v, %v; want the cached permanent failure", rec, err)
	}
	if n := f.rows(t, "capped") + f.rows(t, "permanent"); n != 0 {
		t.Fatalf("%d ledger rows of failed messages, want 0", n)
	}
}

// The same key with another payload is a permanent failure: acked, not run.
func TestTransactionalMismatch(t *testing.T) {
	t.Parallel()
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults())
	if _, err := f.h(message.NewMessage("m-5", []byte("pay 100"))); err != nil {
		t.Fatal(err)
	}
	f.event(t)
	if _, err := f.h(message.NewMessage("m-5", []byte("pay 999"))); err != nil {
		t.Fatalf("mismatch = %v, want an ack", err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeRejected || !errors.Is(e.Err, pipeline.ErrMismatch) {
		t.Fatalf("mismatch = %v (%v), want rejected with ErrMismatch", e.Outcome, e.Err)
	}
	if n := f.rows(t, "m-5"); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}

// hold makes the handler of the first delivery wait inside its transaction
// until released; it reports when it holds.
type hold struct {
	holding chan struct{}
	release chan struct{}
	once    sync.Once
}

func newHold() *hold {
	return &hold{holding: make(chan struct{}), release: make(chan struct{})}
}

func (h *hold) after(fail error) func(*message.Message) error {
	return func(*message.Message) error {
		first := false
		h.once.Do(func() { first = true })
		if !first {
			return nil
		}
		close(h.holding)
		<-h.release
		return fail
	}
}

// A duplicate that arrives while the first delivery's transaction is open
// waits on the claimed row, then replays what the first committed.
func TestTransactionalConcurrentDuplicateWaitsThenReplays(t *testing.T) {
	t.Parallel()
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults())
	h := newHold()
	f.after = h.after(nil)

	first := make(chan error, 1)
	go func() { _, err := f.deliver("m-6"); first <- err }()
	<-h.holding
	second := make(chan []*message.Message, 1)
	go func() {
		out, err := f.deliver("m-6")
		if err != nil {
			t.Errorf("duplicate: %v", err)
		}
		second <- out
	}()
	waitForLockWait(t, f.pool, f.schema)
	close(h.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if out := <-second; len(out) != 1 || out[0].UUID != "out-m-6" {
		t.Fatalf("the waiting duplicate got %v, want the replayed output", out)
	}
	events := []pipeline.Event{f.event(t), f.event(t)}
	// The two deliveries end together: their events arrive in either order.
	if events[0].Outcome == pipeline.OutcomeReplayed {
		events[0], events[1] = events[1], events[0]
	}
	if events[0].Outcome != pipeline.OutcomeExecuted || events[1].Outcome != pipeline.OutcomeReplayed || !events[1].Contended {
		t.Fatalf("events %v / %v (contended %v), want executed then a contended replay", events[0].Outcome, events[1].Outcome, events[1].Contended)
	}
	if n := f.rows(t, "m-6"); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}

// When the first delivery rolls back, the waiting duplicate takes the key
// and runs, as attempt 2.
func TestTransactionalWaiterTakesTheKeyAfterARollback(t *testing.T) {
	t.Parallel()
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults())
	h := newHold()
	f.after = h.after(errors.New("transient"))

	first := make(chan error, 1)
	go func() { _, err := f.deliver("m-7"); first <- err }()
	<-h.holding
	second := make(chan error, 1)
	go func() { _, err := f.deliver("m-7"); second <- err }()
	waitForLockWait(t, f.pool, f.schema)
	close(h.release)
	if err := <-first; err == nil {
		t.Fatal("the failing first delivery was acked")
	}
	if err := <-second; err != nil {
		t.Fatalf("the waiting duplicate = %v, want it to run and succeed", err)
	}
	if n := f.rows(t, "m-7"); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
	rec, err := f.s.Get(t.Context(), "ledger", "m-7")
	if err != nil || rec.Status != store.StatusSucceeded {
		t.Fatalf("record = %v, %v; want succeeded (the first's retryable record must not overwrite it)", rec.Status, err)
	}
}

// A duplicate waits at most HeldKeyTimeout, then nacks.
func TestTransactionalDuplicateWaitIsBounded(t *testing.T) {
	t.Parallel()
	p := policy.Policy{}.WithDefaults()
	p.HeldKeyTimeout = 200 * time.Millisecond
	p.NackDelay = -1 // no pause
	f := newLedgerFixture(t, p)
	h := newHold()
	f.after = h.after(nil)

	first := make(chan error, 1)
	go func() { _, err := f.deliver("m-8"); first <- err }()
	<-h.holding
	start := time.Now()
	_, err := f.deliver("m-8")
	waited := time.Since(start)
	if !errors.Is(err, pipeline.ErrKeyHeld) {
		t.Fatalf("duplicate past the bound = %v, want ErrKeyHeld (a nack)", err)
	}
	if waited < p.HeldKeyTimeout {
		t.Fatalf("the duplicate gave up after %v, before the bound %v", waited, p.HeldKeyTimeout)
	}
	close(h.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// Its redelivery replays.
	if _, err := f.deliver("m-8"); err != nil {
		t.Fatal(err)
	}
	if n := f.rows(t, "m-8"); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
}

// 64 deliveries of one key over 8 connections: one business row, 63
// replays, with the claim sent up front and with the handler's first
// statement (WithDeferredClaim).
func TestTransactional64DeliveriesOfOneKey(t *testing.T) {
	t.Parallel()
	for _, deferred := range []bool{false, true} {
		t.Run(fmt.Sprintf("deferred=%v", deferred), func(t *testing.T) {
			t.Parallel()
			testTransactional64DeliveriesOfOneKey(t, deferred)
		})
	}
}

func testTransactional64DeliveriesOfOneKey(t *testing.T, deferred bool) {
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults())
	small := testenv.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 8 })
	s, err := postgres.New(small, postgres.Options{Schema: f.schema, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	var replays, executed atomic.Int64
	r, err := receiver.NewTransactional(s).WithDeferredClaim(deferred).WithScope("ledger").WithEventHandler(func(e pipeline.Event) {
		switch e.Outcome {
		case pipeline.OutcomeReplayed:
			replays.Add(1)
		case pipeline.OutcomeExecuted:
			executed.Add(1)
		}
	}).Build()
	if err != nil {
		t.Fatal(err)
	}
	h := r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, err := tx.Exec(msg.Context(), "INSERT INTO "+f.ledger+" (message_uuid, amount) VALUES ($1, 100)", msg.UUID)
		time.Sleep(5 * time.Millisecond) // others pile up on the claimed row
		return nil, err
	})
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			if _, err := h(message.NewMessage("one-key", []byte("pay 100"))); err != nil {
				t.Errorf("delivery: %v", err)
			}
		})
	}
	wg.Wait()
	if n := f.rows(t, "one-key"); n != 1 || executed.Load() != 1 || replays.Load() != 63 {
		t.Fatalf("%d ledger rows, %d executed, %d replays; want 1, 1, 63", n, executed.Load(), replays.Load())
	}
}

// A retry attempt gets a fresh transaction: the failed attempt's writes are
// gone, and the key is claimed again in the new one.
func TestTransactionalRetryGetsAFreshTransaction(t *testing.T) {
	t.Parallel()
	rc := pipeline.RetryConfig{}
	rc.InitialInterval, rc.MaxInterval = time.Millisecond, time.Millisecond
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults(), func(b *receiver.Builder) { b.WithRetry(rc) })
	var tries atomic.Int64
	f.after = func(*message.Message) error {
		if tries.Add(1) == 1 {
			return errors.New("transient")
		}
		return nil
	}
	if _, err := f.deliver("m-9"); err != nil {
		t.Fatal(err)
	}
	if tries.Load() != 2 {
		t.Fatalf("%d tries, want 2", tries.Load())
	}
	if n := f.rows(t, "m-9"); n != 1 {
		t.Fatalf("%d ledger rows, want 1: the first attempt's INSERT must roll back", n)
	}
	if rec, err := f.s.Get(t.Context(), "ledger", "m-9"); err != nil || rec.Status != store.StatusSucceeded || rec.Attempt != 1 {
		t.Fatalf("record = %v attempt %d, %v; want succeeded at attempt 1 (in-process retries are one delivery)", rec.Status, rec.Attempt, err)
	}
}

// A success is replayed for SuccessTTL from its commit, not from the start
// of its transaction, however long the handler ran.
func TestTransactionalExpiryCountsFromTheCommit(t *testing.T) {
	t.Parallel()
	p := policy.Policy{}.WithDefaults()
	p.SuccessTTL = 10 * time.Second
	f := newLedgerFixture(t, p)
	f.silent = true // with a result to write, the commit always moves the expiry
	// The claim's expiry counts from the start of the transaction; its
	// slack is 1% of SuccessTTL (100ms). A handler inside the slack leaves
	// it, a longer one makes the commit move the expiry. Either way the
	// record must live SuccessTTL past the commit, which is later than the
	// transaction's start by at least the handler's run.
	for _, run := range []time.Duration{50 * time.Millisecond, 200 * time.Millisecond} {
		t.Run(run.String(), func(t *testing.T) {
			key := "run-" + run.String()
			f.after = func(*message.Message) error { time.Sleep(run); return nil }
			if _, err := f.deliver(key); err != nil {
				t.Fatal(err)
			}
			var lifetime time.Duration
			if err := f.pool.QueryRow(t.Context(), "SELECT extract(epoch FROM expires_at - created_at) * 1e9 FROM "+table(f.schema, "")+" WHERE key = $1", key).Scan(&lifetime); err != nil {
				t.Fatal(err)
			}
			if lifetime < p.SuccessTTL+run {
				t.Fatalf("the record expires %v after its transaction began, want at least SuccessTTL %v plus the handler's %v", lifetime, p.SuccessTTL, run)
			}
		})
	}
}

// The handler's pgx.Tx: the stage ends it, savepoints work, and it is
// unusable once the delivery is over.
func TestTransactionalHandlerTx(t *testing.T) {
	t.Parallel()
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults())
	var kept pgx.Tx
	f.after = func(msg *message.Message) error {
		tx, _ := postgres.TxFromContext(msg.Context())
		kept = tx
		if err := tx.Commit(msg.Context()); !errors.Is(err, postgres.ErrTxOwned) {
			return fmt.Errorf("tx.Commit = %v, want ErrTxOwned", err)
		}
		if err := tx.Rollback(msg.Context()); !errors.Is(err, postgres.ErrTxOwned) {
			return fmt.Errorf("tx.Rollback = %v, want ErrTxOwned", err)
		}
		sp, err := tx.Begin(msg.Context())
		if err != nil {
			return err
		}
		if _, err := sp.Exec(msg.Context(), "INSERT INTO "+f.ledger+" (message_uuid, amount) VALUES ($1, 1)", msg.UUID); err != nil {
			return err
		}
		return sp.Rollback(msg.Context()) // undoes only the savepoint's row
	}
	if _, err := f.deliver("m-10"); err != nil {
		t.Fatal(err)
	}
	if n := f.rows(t, "m-10"); n != 1 {
		t.Fatalf("%d ledger rows, want 1: the savepoint's row rolled back, the handler's committed", n)
	}
	if _, err := kept.Exec(context.Background(), "SELECT 1"); !errors.Is(err, pgx.ErrTxClosed) {
		t.Fatalf("the handler's tx after the delivery = %v, want pgx.ErrTxClosed", err)
	}
}

// A handler that swallows the error of its own statement leaves the
// transaction aborted: the commit rolls back, and the delivery is nacked,
// not acked as a success.
func TestTransactionalAbortedTransactionIsNotASuccess(t *testing.T) {
	t.Parallel()
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults())
	f.after = func(msg *message.Message) error {
		tx, _ := postgres.TxFromContext(msg.Context())
		_, _ = tx.Exec(msg.Context(), "SELECT 1/0") // error ignored
		return nil
	}
	if _, err := f.deliver("m-11"); !errors.Is(err, pgx.ErrTxCommitRollback) {
		t.Fatalf("delivery = %v, want a nack wrapping pgx.ErrTxCommitRollback", err)
	}
	if n := f.rows(t, "m-11"); n != 0 {
		t.Fatalf("%d ledger rows, want 0", n)
	}
	if rec, err := f.s.Get(t.Context(), "ledger", "m-11"); err != nil || rec.Status != store.StatusRetryable {
		t.Fatalf("record = %v, %v; want retryable", rec.Status, err)
	}
}

// hotUpdates returns how many updates of the records table there were and
// how many of them were HOT, once the backend of conn has reported them.
func hotUpdates(t *testing.T, conn *pgxpool.Conn, schema string) (updates, hot int64) {
	t.Helper()
	ctx := t.Context()
	if _, err := conn.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "SELECT pg_stat_clear_snapshot()"); err != nil { // a transaction ends: the flush happens
		t.Fatal(err)
	}
	err := conn.QueryRow(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = $2`,
		schema, postgres.DefaultTable).Scan(&updates, &hot)
	if err != nil {
		t.Fatal(err)
	}
	return updates, hot
}

// The writes after a claim change no indexed column, so they are HOT
// updates: the lease mode's Complete, and the one-transaction commit that
// stores produced messages.
func TestCompletionsAreHOTUpdates(t *testing.T) {
	pool := testenv.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 1 }) // one backend: its own counts
	schema := testenv.Schema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema})
	ctx := t.Context()
	const n = 200
	for i := range n {
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "lease", Key: fmt.Sprint(i), LeaseDuration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: []byte("produced"), TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		claim, err := s.ClaimInTx(ctx, store.TxRequest{Scope: "tx", Key: fmt.Sprint(i), SuccessTTL: time.Hour, Wait: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if err := claim.Tx.Commit(ctx, []byte("produced")); err != nil {
			t.Fatal(err)
		}
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	updates, hot := hotUpdates(t, conn, schema)
	if updates != 2*n || hot < updates*9/10 {
		t.Fatalf("%d updates, %d of them HOT; want %d, nearly all HOT", updates, hot, 2*n)
	}
	t.Logf("%d of %d updates were HOT", hot, updates)
}

// A cached failure is forwarded to the dead-letter topic once, before it is
// recorded, in the one-transaction mode too; its writes roll back.
func TestTransactionalDeadLetter(t *testing.T) {
	t.Parallel()
	pubSub := gochannel.NewGoChannel(gochannel.Config{OutputChannelBuffer: 10}, watermill.NopLogger{})
	t.Cleanup(func() { _ = pubSub.Close() })
	dead, err := pubSub.Subscribe(t.Context(), "payments.dead")
	if err != nil {
		t.Fatal(err)
	}
	f := newLedgerFixture(t, policy.Policy{}.WithDefaults(), func(b *receiver.Builder) { b.WithDeadLetter(pubSub, "payments.dead") })
	f.after = func(*message.Message) error { return policy.Cached(errors.New("card declined")) }
	for range 2 { // the broker delivers it twice
		if _, err := f.deliver("m-12"); err != nil {
			t.Fatalf("a permanent failure = %v, want an ack", err)
		}
	}
	select {
	case m := <-dead:
		m.Ack()
		if m.UUID != "m-12" || pipeline.DeadLetterReason(m.Metadata.Get(pipeline.ReasonKindKey)) != pipeline.DeadLetterReasonCachedFailure {
			t.Fatalf("dead letter %s %v", m.UUID, m.Metadata)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no dead letter")
	}
	select {
	case m := <-dead:
		t.Fatalf("a second dead letter %s: the duplicate of a cached failure must not be forwarded again", m.UUID)
	default:
	}
	if n := f.rows(t, "m-12"); n != 0 {
		t.Fatalf("%d ledger rows, want 0", n)
	}
}

// In the DELETE layout a one-transaction replay costs three round trips:
// BEGIN with the insert of a new key's record, which finds the row; the
// claim that answers; ROLLBACK. So does a mismatch, and a key another
// delivery holds, whose claim waits for it. The insert answers nothing, so
// that a new key costs no more than a hand-written inbox's insert.
func TestTransactionalReplayInThreeRoundTrips(t *testing.T) {
	t.Parallel()
	count := &statementCounter{}
	pool := testenv.Pool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = count })
	s := newStore(t, pool, postgres.Options{})
	ctx := t.Context()
	req := func(key, fp string) store.TxRequest {
		return store.TxRequest{Scope: "rt", Key: key, Fingerprint: fp, SuccessTTL: time.Hour, Wait: 100 * time.Millisecond}
	}
	claim := func(r store.TxRequest, want store.Decision) (store.TxResult, statementCounts) {
		t.Helper()
		before := count.load()
		res, err := s.ClaimInTx(ctx, r)
		if err != nil || res.Decision != want {
			t.Fatalf("claim of %q = %+v, %v; want %v", r.Key, res.ClaimResult, err, want)
		}
		return res, count.load().minus(before)
	}
	first, _ := claim(req("done", "fp"), store.DecisionExecute)
	if err := first.Tx.Commit(ctx, []byte("result")); err != nil {
		t.Fatal(err)
	}
	res, got := claim(req("done", "fp"), store.DecisionReplay)
	if got.roundTrips != 3 || got.commits != 0 || string(res.Record.Result) != "result" {
		t.Errorf("replay: %v round trips, %v commits, result %q; want 3, 0 and %q", got.roundTrips, got.commits, res.Record.Result, "result")
	}
	if _, got := claim(req("done", "other"), store.DecisionMismatch); got.roundTrips != 3 {
		t.Errorf("mismatch: %v round trips, want 3", got.roundTrips)
	}
	holder, _ := claim(req("held", ""), store.DecisionExecute)
	defer holder.Tx.Rollback(ctx) //nolint:errcheck // the test's end
	if _, got := claim(req("held", ""), store.DecisionHeld); got.roundTrips != 3 {
		t.Errorf("a held key: %v round trips, want 3", got.roundTrips)
	}
}
