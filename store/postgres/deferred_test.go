package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// deferredFixture is the one-transaction mode with WithDeferredClaim on a
// store of either layout, whose pool counts round trips, around body.
type deferredFixture struct {
	pool   *pgxpool.Pool
	count  *statementCounter
	s      *postgres.Store
	ledger string
	events chan pipeline.Event
	calls  atomic.Int64
	h      message.HandlerFunc
}

// book is the business write: a ledger row for msg.
func (f *deferredFixture) book(msg *message.Message) error {
	tx, _ := postgres.TxFromContext(msg.Context())
	_, err := tx.Exec(msg.Context(), "INSERT INTO "+f.ledger+" (message_uuid) VALUES ($1)", msg.UUID)
	return err
}

func newDeferredFixture(t *testing.T, layout postgres.Layout, body func(f *deferredFixture, msg *message.Message) ([]*message.Message, error), configure ...func(*pgxpool.Config)) *deferredFixture {
	t.Helper()
	f := &deferredFixture{count: &statementCounter{}, events: make(chan pipeline.Event, 64)}
	f.pool = testenv.Pool(t, append([]func(*pgxpool.Config){func(c *pgxpool.Config) { c.ConnConfig.Tracer = f.count }}, configure...)...)
	schema := testenv.Schema(t, f.pool)
	f.s = newStore(t, f.pool, postgres.Options{Schema: schema, Layout: layout})
	f.ledger = pgx.Identifier{schema, "ledger"}.Sanitize()
	run(t, f.pool, "CREATE TABLE "+f.ledger+" (message_uuid text NOT NULL)")
	p := policy.Policy{}.WithDefaults()
	p.LeaseDuration, p.Heartbeat, p.AttemptDelay = 0, 0, -1
	r, err := receiver.NewTransactional(f.s).WithDeferredClaim(true).WithScope("ledger").WithPolicy(p).
		WithRetry(pipeline.RetryConfig{MaxTries: 1}).
		WithEventHandler(func(e pipeline.Event) { f.events <- e }).Build()
	if err != nil {
		t.Fatal(err)
	}
	f.h = r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		f.calls.Add(1)
		return body(f, msg)
	})
	return f
}

func (f *deferredFixture) rows(t *testing.T, uuid string) int {
	t.Helper()
	return ledgerRows(t, f.pool, f.ledger, uuid)
}

func (f *deferredFixture) event(t *testing.T) pipeline.Event {
	t.Helper()
	return nextEvent(t, f.events)
}

// forLayouts runs test on both layouts.
func forLayouts(t *testing.T, test func(t *testing.T, layout postgres.Layout)) {
	t.Parallel()
	for name, layout := range map[string]postgres.Layout{"delete": postgres.LayoutDelete, "partitioned": postgres.LayoutPartitioned} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			test(t, layout)
		})
	}
}

func booked(f *deferredFixture, msg *message.Message) ([]*message.Message, error) {
	if err := f.book(msg); err != nil {
		return nil, err
	}
	return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte("booked"))}, nil
}

// A new key costs two round trips with the claim deferred: BEGIN, the
// claim and the handler's statement in one; COMMIT.
func TestDeferredClaimCostsTwoRoundTrips(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout postgres.Layout) {
		f := newDeferredFixture(t, layout, booked)
		if _, err := f.h(message.NewMessage("warm", nil)); err != nil { // prepares the statements
			t.Fatal(err)
		}
		f.event(t)
		before := f.count.load()
		const n = 20
		for i := range n {
			if _, err := f.h(message.NewMessage(fmt.Sprintf("m-%d", i), nil)); err != nil {
				t.Fatal(err)
			}
			if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 1 || e.Contended {
				t.Fatalf("event %+v, want executed at attempt 1, not contended", e)
			}
		}
		if got := f.count.load().minus(before); got.roundTrips != 2*n || got.commits != n {
			t.Fatalf("%v messages took %v round trips and %v commits, want %v and %v", n, got.roundTrips, got.commits, 2*n, n)
		}
	})
}

// A duplicate of a finished key runs the handler up to its first
// statement, which fails with an error wrapping store.ErrLeaseLost; nothing
// of it commits, and the delivery replays the recorded success, whether
// the handler returns the error or swallows it and returns nil.
func TestDeferredClaimOfADuplicateReplays(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout postgres.Layout) {
		var stmtErrs []error
		f := newDeferredFixture(t, layout, func(f *deferredFixture, msg *message.Message) ([]*message.Message, error) {
			err := f.book(msg)
			stmtErrs = append(stmtErrs, err)
			if msg.Metadata.Get("swallow") != "" {
				return nil, nil
			}
			if err != nil {
				return nil, err
			}
			return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte("booked"))}, nil
		})
		first, err := f.h(message.NewMessage("m-1", nil))
		if err != nil || len(first) != 1 {
			t.Fatalf("first delivery = %v, %v", first, err)
		}
		f.event(t)
		for _, swallow := range []string{"", "yes"} {
			dup := message.NewMessage("m-1", nil)
			dup.Metadata.Set("swallow", swallow)
			out, err := f.h(dup)
			if err != nil || len(out) != 1 || out[0].UUID != first[0].UUID {
				t.Fatalf("duplicate (swallow %q) = %v, %v; want the first delivery's message replayed", swallow, out, err)
			}
			if e := f.event(t); e.Outcome != pipeline.OutcomeReplayed || !e.Contended {
				t.Fatalf("duplicate (swallow %q): event %+v, want replayed and contended", swallow, e)
			}
		}
		if n := f.rows(t, "m-1"); n != 1 || f.calls.Load() != 3 {
			t.Fatalf("%d ledger rows after %d handler runs; want 1 row, 3 runs (each duplicate runs up to its statement)", n, f.calls.Load())
		}
		if len(stmtErrs) != 3 || stmtErrs[0] != nil || !errors.Is(stmtErrs[1], store.ErrLeaseLost) || !errors.Is(stmtErrs[2], store.ErrLeaseLost) {
			t.Fatalf("the statements returned %v; want nil, then errors wrapping store.ErrLeaseLost", stmtErrs)
		}
	})
}

// A handler that fails before any statement: for a new key the failure is
// the key's (recorded, retryable); for a finished key the rollback sends
// the claim, which finds the record, and the delivery replays instead of
// recording a failure over it.
func TestDeferredClaimFailureWithoutAStatement(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout postgres.Layout) {
		errTimeout := errors.New("upstream timeout")
		f := newDeferredFixture(t, layout, func(f *deferredFixture, msg *message.Message) ([]*message.Message, error) {
			if msg.Metadata.Get("fail") != "" {
				return nil, errTimeout
			}
			return booked(f, msg)
		})
		fail := func(uuid string) *message.Message {
			m := message.NewMessage(uuid, nil)
			m.Metadata.Set("fail", "yes")
			return m
		}
		if _, err := f.h(fail("new")); !errors.Is(err, errTimeout) {
			t.Fatalf("failing delivery of a new key = %v, want the handler's error", err)
		}
		if e := f.event(t); e.Outcome == pipeline.OutcomeReplayed || e.Attempt != 1 {
			t.Fatalf("event %+v, want the failure of attempt 1", e)
		}
		if rec, err := f.s.Get(context.Background(), "ledger", "new"); err != nil || rec.Status != store.StatusRetryable || rec.Attempt != 1 {
			t.Fatalf("record = %+v, %v; want retryable at attempt 1", rec, err)
		}

		if _, err := f.h(message.NewMessage("done", nil)); err != nil {
			t.Fatal(err)
		}
		f.event(t)
		out, err := f.h(fail("done"))
		if err != nil || len(out) != 1 || out[0].UUID != "out-done" {
			t.Fatalf("failing duplicate of a finished key = %v, %v; want the success replayed", out, err)
		}
		if e := f.event(t); e.Outcome != pipeline.OutcomeReplayed {
			t.Fatalf("event %+v, want replayed", e)
		}
		if rec, err := f.s.Get(context.Background(), "ledger", "done"); err != nil || rec.Status != store.StatusSucceeded {
			t.Fatalf("record = %+v, %v; want the success kept", rec, err)
		}
	})
}

// The builder refuses WithDeferredClaim where it has no meaning: the lease
// mode, and the watermark mode, which defers its own way.
func TestDeferredClaimRefusedOutsideTheKeyMode(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := newStore(t, pool, postgres.Options{})
	for name, b := range map[string]*receiver.Builder{
		"New": receiver.New(s),
		"WithKafkaWatermark": receiver.NewTransactional(s).WithKafkaWatermark(pipeline.KafkaWatermark{
			Group:    "g",
			Position: func(*message.Message) (store.KafkaPosition, error) { return store.KafkaPosition{}, nil },
		}),
	} {
		_, err := b.WithDeferredClaim(true).Build()
		if err == nil || !strings.Contains(err.Error(), "WithDeferredClaim") {
			t.Errorf("%s with WithDeferredClaim = %v, want an error naming WithDeferredClaim", name, err)
		}
	}
}

// A connection that dies before the handler's first statement fails the
// deferred claim with it: the delivery claims again up front on a new
// connection and runs, at attempt 1 still (a store failure spends no
// attempt), with one business row.
func TestDeferredClaimLostConnectionIsNotAnAttempt(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout postgres.Layout) {
		admin := testenv.Pool(t)
		app := "oncemill-deferred-cut-" + testenv.Schema(t, admin)
		var cut atomic.Bool
		f := newDeferredFixture(t, layout, func(f *deferredFixture, msg *message.Message) ([]*message.Message, error) {
			if !cut.Swap(true) {
				var n int
				if err := admin.QueryRow(msg.Context(), "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n); err != nil || n == 0 {
					return nil, fmt.Errorf("terminating the fixture's connections: %d, %v", n, err)
				}
			}
			return booked(f, msg)
		}, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
		if _, err := f.h(message.NewMessage("m-1", nil)); err != nil {
			t.Fatalf("delivery = %v, want a success after the claim is made again", err)
		}
		if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 1 || !e.Contended {
			t.Fatalf("event %+v, want executed at attempt 1, contended", e)
		}
		if n := f.rows(t, "m-1"); n != 1 || f.calls.Load() != 2 {
			t.Fatalf("%d ledger rows after %d handler runs; want 1 row, 2 runs", n, f.calls.Load())
		}
	})
}

// Whatever the handler's first call on its transaction, a deferred claim of
// a recorded key refuses it with an error wrapping store.ErrLeaseLost, the
// calls after it fail too, nothing commits, and Commit and Rollback say the
// claim was lost; on a new key the same first call works and commits.
func TestDeferredClaimRefusesEveryFirstCall(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout postgres.Layout) {
		pool := testenv.Pool(t)
		schema := testenv.Schema(t, pool)
		s := newStore(t, pool, postgres.Options{Schema: schema, Layout: layout})
		ledger := pgx.Identifier{schema, "ledger"}.Sanitize()
		run(t, pool, "CREATE TABLE "+ledger+" (key text NOT NULL, amount int NOT NULL)")
		insert := "INSERT INTO " + ledger + " (key, amount) VALUES ($1, 100)"
		claim := func(key string) store.TxResult {
			t.Helper()
			res, err := s.ClaimInTx(t.Context(), store.TxRequest{Scope: "s", Key: key, SuccessTTL: time.Hour, Wait: time.Second, Deferrable: true})
			if err != nil || res.Decision != store.DecisionExecute || res.Tx == nil {
				t.Fatalf("deferred claim of %q = %+v, %v; want Execute with a transaction", key, res, err)
			}
			return res
		}
		for _, tc := range []struct {
			name  string
			first func(ctx context.Context, tx pgx.Tx, key string) error
		}{
			{"exec", func(ctx context.Context, tx pgx.Tx, key string) error {
				_, err := tx.Exec(ctx, insert, key)
				return err
			}},
			{"query row", func(ctx context.Context, tx pgx.Tx, key string) error {
				var k string
				return tx.QueryRow(ctx, "INSERT INTO "+ledger+" (key, amount) VALUES ($1, 100) RETURNING key", key).Scan(&k)
			}},
			{"query", func(ctx context.Context, tx pgx.Tx, key string) error {
				rows, err := tx.Query(ctx, "INSERT INTO "+ledger+" (key, amount) VALUES ($1, 100) RETURNING key", key)
				if err != nil {
					return err
				}
				rows.Close()
				return rows.Err()
			}},
			{"send batch", func(ctx context.Context, tx pgx.Tx, key string) error {
				b := &pgx.Batch{}
				b.Queue(insert, key)
				return tx.SendBatch(ctx, b).Close()
			}},
			{"copy from", func(ctx context.Context, tx pgx.Tx, key string) error {
				_, err := tx.CopyFrom(ctx, pgx.Identifier{schema, "ledger"}, []string{"key", "amount"}, pgx.CopyFromRows([][]any{{key, 100}}))
				return err
			}},
			{"savepoint", func(ctx context.Context, tx pgx.Tx, key string) error {
				sp, err := tx.Begin(ctx)
				if err != nil {
					return err
				}
				if _, err := sp.Exec(ctx, insert, key); err != nil {
					return err
				}
				return sp.Commit(ctx)
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				ctx := t.Context()
				key := "k-" + strings.ReplaceAll(tc.name, " ", "-")
				res := claim(key) // a new key: the first call works
				tx, _ := postgres.TxFromContext(res.Tx.Context(ctx))
				if err := tc.first(ctx, tx, key); err != nil {
					t.Fatalf("first call on a new key: %v", err)
				}
				if err := res.Tx.Commit(ctx, nil); err != nil {
					t.Fatalf("commit: %v", err)
				}
				for _, end := range []string{"commit", "rollback"} {
					dup := claim(key)
					tx, _ := postgres.TxFromContext(dup.Tx.Context(ctx))
					if err := tc.first(ctx, tx, key); !errors.Is(err, store.ErrLeaseLost) {
						t.Fatalf("first call on a recorded key = %v, want an error wrapping store.ErrLeaseLost", err)
					}
					if _, err := tx.Exec(ctx, insert, key); !errors.Is(err, store.ErrLeaseLost) {
						t.Fatalf("the next call = %v, want the same refusal", err)
					}
					var err error
					if end == "commit" {
						err = dup.Tx.Commit(ctx, nil)
					} else {
						err = dup.Tx.Rollback(ctx)
					}
					if !errors.Is(err, store.ErrLeaseLost) {
						t.Fatalf("%s after the refusal = %v, want an error wrapping store.ErrLeaseLost", end, err)
					}
				}
				var n int
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+ledger+" WHERE key = $1", key).Scan(&n); err != nil || n != 1 {
					t.Fatalf("%d ledger rows (%v), want the new key's one", n, err)
				}
			})
		}
	})
}

// A deferred claim of a new key is a plain insert that fails, at once,
// when it does not take the key: when another transaction holds the key's
// lock (its row not committed), when the key has a row, and, in the
// partitioned layout, when the clock is outside the partition's range. It
// fails with the SQLSTATE of the guard that refused it, and inserts
// nothing.
func TestDeferredNewKeyGuards(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout postgres.Layout) {
		pool := testenv.Pool(t)
		schema := testenv.Schema(t, pool)
		ctx := t.Context()
		var s *postgres.Store
		var insert func(partition string) string
		tbl := table(schema, "")
		if layout == postgres.LayoutPartitioned {
			s = newPartitioned(t, pool, schema, postgres.Options{})
			tbl = table(schema, partitionedTable)
			dropAllPartitions(t, pool, schema)
			now := dbNow(t, pool)
			addPartition(t, pool, schema, "now", now.Add(-time.Hour), now.Add(time.Hour))
			addPartition(t, pool, schema, "past", now.Add(-2*time.Hour), now.Add(-time.Hour))
			insert = s.DeferredNewKeyInOneStatement
		} else {
			s = newStore(t, pool, postgres.Options{Schema: schema})
			insert = func(string) string { return s.DeferredNewKey() }
		}
		claim := func(ctx context.Context, q pgx.Tx, partition, key string) error {
			tag, err := q.Exec(ctx, insert(partition), "s", key, "", int64(time.Hour/time.Microsecond),
				int64(time.Hour/time.Microsecond), postgres.ClaimLockKey("s", key), "uuid-"+key)
			if err == nil && tag.RowsAffected() != 1 {
				err = fmt.Errorf("%d rows inserted", tag.RowsAffected())
			}
			return err
		}
		rows := func(key string) int {
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl+" WHERE scope = 's' AND key = $1", key).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		refused := func(what, key, partition, code string) {
			t.Helper()
			quick, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			err := pgx.BeginFunc(quick, pool, func(tx pgx.Tx) error { return claim(quick, tx, partition, key) })
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != code {
				t.Fatalf("%s: %v; want SQLSTATE %s at once", what, err, code)
			}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return claim(ctx, tx, "now", "new") }); err != nil {
			t.Fatal(err)
		}
		if n := rows("new"); n != 1 {
			t.Fatalf("a new key's rows: %d; want one", n)
		}
		refused("a key with a row", "new", "now", "23505")
		if n := rows("new"); n != 1 {
			t.Fatalf("the key's rows after a refused claim: %d; want one", n)
		}
		if layout == postgres.LayoutPartitioned {
			refused("a partition whose range has ended", "late", "past", "23514")
			if n := rows("late"); n != 0 {
				t.Fatalf("a claim into an ended partition inserted %d rows", n)
			}
		}
		holder, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer holder.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the test's end
		if err := claim(ctx, holder, "now", "held"); err != nil {
			t.Fatal(err)
		}
		refused("a key whose lock another transaction holds", "held", "now", "23502")
	})
}

// A deferred claim of a key that a retryable failure holds back
// (Completion.RetryAfter) is lost, as one of a recorded key is, and leaves
// the record as it was; the claim decided up front then answers Held with
// the time left, at once and uncontended.
func TestDeferredClaimOfAHeldBackKeyIsLost(t *testing.T) {
	forLayouts(t, func(t *testing.T, layout postgres.Layout) {
		pool := testenv.Pool(t)
		s := newStore(t, pool, postgres.Options{Schema: testenv.Schema(t, pool), Layout: layout})
		ctx := t.Context()
		req := store.TxRequest{Scope: "s", Key: "k", Fingerprint: "fp", SuccessTTL: time.Hour, Wait: time.Second}
		first, err := s.ClaimInTx(ctx, req)
		if err != nil || first.Decision != store.DecisionExecute {
			t.Fatalf("first claim = %v, %v; want execute", first.Decision, err)
		}
		if err := first.Tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := s.RecordRollback(ctx, first.Claim, "fp", store.Completion{Status: store.StatusRetryable, TTL: time.Hour, RetryAfter: time.Minute}); err != nil {
			t.Fatal(err)
		}
		before, err := s.Get(ctx, "s", "k")
		if err != nil || before.RetryAt.IsZero() {
			t.Fatalf("record = %+v, %v; want one held back", before, err)
		}

		deferred := req
		deferred.Deferrable = true
		res, err := s.ClaimInTx(ctx, deferred)
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("deferred claim = %v, %v; want a provisional execute", res.Decision, err)
		}
		if err := res.Tx.Commit(ctx, nil); !errors.Is(err, store.ErrLeaseLost) {
			t.Fatalf("Commit of the deferred claim of a held-back key = %v, want ErrLeaseLost", err)
		}

		held, err := s.ClaimInTx(ctx, req)
		if err != nil || held.Decision != store.DecisionHeld || held.Contended || held.Tx != nil {
			t.Fatalf("claim up front = %+v, %v; want held, uncontended, no transaction", held, err)
		}
		if held.RetryIn <= 0 || held.RetryIn > time.Minute {
			t.Fatalf("held-back claim's RetryIn = %v, want within a minute", held.RetryIn)
		}
		if rec := held.Record; rec == nil || !rec.RetryAt.Equal(before.RetryAt) {
			t.Fatalf("held-back claim's record = %+v, want RetryAt %v", rec, before.RetryAt)
		}
		after, err := s.Get(ctx, "s", "k")
		if err != nil || after.Token != before.Token || after.Attempt != before.Attempt || !after.UpdatedAt.Equal(before.UpdatedAt) || !after.RetryAt.Equal(before.RetryAt) {
			t.Fatalf("record after the held-back claims = %+v, %v; want it unchanged, %+v", after, err, before)
		}
	})
}
