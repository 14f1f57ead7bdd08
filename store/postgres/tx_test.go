package postgres_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// The transaction manager must satisfy the pipeline's interface without
// store/postgres importing pipeline.
var _ pipeline.TxManager = (*postgres.TxManager)(nil)

// ledgerFixture is a store, a ledger table for the handler's business
// writes, and the real pipeline around a handler:
// idempotency → transaction → handler.
type ledgerFixture struct {
	pool   *pgxpool.Pool
	schema string
	s      *postgres.Store
	ledger string
	// handler runs inside the transaction, after the ledger INSERT.
	after func(msg *message.Message) error
	h     message.HandlerFunc
}

func newLedgerFixture(t *testing.T, p policy.Policy) *ledgerFixture {
	t.Helper()
	f := &ledgerFixture{pool: newPool(t, nil)}
	f.schema = newSchema(t, f.pool)
	f.s = newStore(t, f.pool, postgres.Options{Schema: f.schema})
	f.ledger = pgx.Identifier{f.schema, "ledger"}.Sanitize()
	if _, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.ledger+" (id bigserial PRIMARY KEY, message_uuid text NOT NULL, amount int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	idem, err := pipeline.NewIdempotency(pipeline.IdempotencyConfig{
		Store:  f.s,
		Keys:   keygen.UUID(),
		Scope:  "ledger",
		Policy: p,
	})
	if err != nil {
		t.Fatal(err)
	}
	txs, err := pipeline.NewTransaction(f.s.TxManager())
	if err != nil {
		t.Fatal(err)
	}
	f.h = idem.Middleware(txs.Middleware(func(msg *message.Message) ([]*message.Message, error) {
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
		return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte("booked"))}, nil
	}))
	return f
}

func (f *ledgerFixture) rows(t *testing.T, uuid string) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.ledger+" WHERE message_uuid = $1", uuid).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// deliver runs the pipeline once, turning a panic that escapes it into an
// error (it should not escape: the idempotency stage recovers it).
func (f *ledgerFixture) deliver(uuid string) (msgs []*message.Message, err error) {
	return f.h(message.NewMessage(uuid, []byte("pay 100")))
}

func TestTransactionalSuccessAndReplay(t *testing.T) {
	f := newLedgerFixture(t, policy.Default())
	ctx := t.Context()

	out, err := f.deliver("m-1")
	if err != nil || len(out) != 1 || out[0].UUID != "out-m-1" {
		t.Fatalf("first delivery = %v, %v", out, err)
	}
	if n := f.rows(t, "m-1"); n != 1 {
		t.Fatalf("%d ledger rows, want 1", n)
	}
	rec, err := f.s.Get(ctx, "ledger", "m-1")
	if err != nil || rec.Status != store.StatusSucceeded {
		t.Fatalf("record = %v, %v; want succeeded", rec.Status, err)
	}

	// A duplicate replays the stored output and writes nothing.
	out, err = f.deliver("m-1")
	if err != nil || len(out) != 1 || out[0].UUID != "out-m-1" {
		t.Fatalf("duplicate = %v, %v; want the replayed output", out, err)
	}
	if n := f.rows(t, "m-1"); n != 1 {
		t.Fatalf("%d ledger rows after the duplicate, want 1", n)
	}
}

func TestTransactionalHandlerErrorRollsBack(t *testing.T) {
	f := newLedgerFixture(t, policy.Default())
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
		t.Fatalf("record = %v attempt %d, %v; want retryable (released), not succeeded", rec.Status, rec.Attempt, err)
	}

	// The redelivery runs again and books once.
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
	f := newLedgerFixture(t, policy.Default())
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

// The lease is taken over while the handler runs (it stalled past its
// lease): CompleteInTx finds the lease lost, and the business write rolls
// back with it. The newer holder's lease is untouched.
func TestTransactionalLeaseLostBeforeCommit(t *testing.T) {
	p := policy.Default()
	f := newLedgerFixture(t, p)
	ctx := t.Context()
	var takeover store.BeginResult
	f.after = func(msg *message.Message) error {
		// The lease runs out (the clock moves past it)...
		advance(t, f.pool, table(f.schema, ""), p.Lease+time.Second)
		// ...and another worker takes the key over.
		var err error
		takeover, err = f.s.Begin(context.Background(), store.BeginRequest{Scope: "ledger", Key: msg.UUID, Lease: time.Minute})
		if err != nil {
			return err
		}
		if takeover.Decision != store.Execute || !takeover.Takeover {
			t.Errorf("other worker's Begin = %v takeover %v; want a takeover", takeover.Decision, takeover.Takeover)
		}
		return nil // the stale handler believes it succeeded
	}

	_, err := f.deliver("m-4")
	if !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("delivery = %v, want an error wrapping store.ErrLeaseLost", err)
	}
	if n := f.rows(t, "m-4"); n != 0 {
		t.Fatalf("%d ledger rows, want 0: the stale worker's write must roll back", n)
	}
	rec, err := f.s.Get(ctx, "ledger", "m-4")
	if err != nil || rec.Status != store.StatusInProgress || rec.Token != takeover.Lease.Token {
		t.Fatalf("record = %v token %d, %v; want in progress under the new token %d", rec.Status, rec.Token, err, takeover.Lease.Token)
	}
}

func TestTxManagerWithoutTransaction(t *testing.T) {
	pool := newPool(t, nil)
	s := newStore(t, pool, postgres.Options{})
	ctx := t.Context()
	tm := s.TxManager()
	lease := store.Lease{Key: "k", Token: 1}
	out := store.Outcome{Status: store.StatusSucceeded, TTL: time.Minute}

	if err := tm.Commit(ctx); !errors.Is(err, store.ErrNoTransaction) {
		t.Errorf("Commit without a transaction = %v", err)
	}
	if err := tm.Rollback(ctx); !errors.Is(err, store.ErrNoTransaction) {
		t.Errorf("Rollback without a transaction = %v", err)
	}
	if err := s.CompleteInTx(ctx, lease, out); !errors.Is(err, store.ErrNoTransaction) {
		t.Errorf("CompleteInTx without a transaction = %v", err)
	}
	if _, ok := postgres.TxFromContext(ctx); ok {
		t.Error("TxFromContext found a transaction in a bare context")
	}

	// A transaction of another store's pool is not this store's.
	other := newStore(t, newPool(t, nil), postgres.Options{})
	txCtx, err := other.TxManager().Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteInTx(txCtx, lease, out); !errors.Is(err, store.ErrNoTransaction) {
		t.Errorf("CompleteInTx with another pool's transaction = %v", err)
	}
	if err := other.TxManager().Rollback(txCtx); err != nil {
		t.Errorf("Rollback: %v", err)
	}
	if err := other.TxManager().Rollback(txCtx); err != nil {
		t.Errorf("second Rollback: %v, want nil", err)
	}

	// CompleteInTx with a lost lease changes nothing and says so.
	res, err := s.Begin(ctx, store.BeginRequest{Key: "k", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	txCtx, err = tm.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stale := res.Lease
	stale.Token--
	if err := s.CompleteInTx(txCtx, stale, out); !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("CompleteInTx with a stale token = %v, want ErrLeaseLost", err)
	}
	if err := tm.Rollback(txCtx); err != nil {
		t.Fatal(err)
	}
	// And with the right one, it counts only on commit.
	txCtx, err = tm.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CompleteInTx(txCtx, res.Lease, out); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "", "k"); err != nil || rec.Status != store.StatusInProgress {
		t.Fatalf("before commit the record is %v, %v; want still in progress", rec.Status, err)
	}
	if err := tm.Commit(txCtx); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(ctx, "", "k"); err != nil || rec.Status != store.StatusSucceeded {
		t.Fatalf("after commit the record is %v, %v; want succeeded", rec.Status, err)
	}
}
