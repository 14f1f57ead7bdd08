package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// The watermark mode's fast path (internal/watermark/fast.go): after a
// process's own commit of a partition's message, the next claim sends
// nothing, BEGIN goes out with the handler's first statement, and the
// commit claims.

// wmFast is a store's watermarks on a pool whose round trips are counted,
// with a ledger keyed by text.
type wmFast struct {
	pool   *pgxpool.Pool
	count  *statementCounter
	st     *postgres.Store
	w      store.Transactional
	ledger string
	schema string
}

func newWMFast(t *testing.T, opts postgres.Options) *wmFast {
	t.Helper()
	f := &wmFast{count: &statementCounter{}}
	f.pool = testenv.Pool(t, func(c *pgxpool.Config) { c.ConnConfig.Tracer = f.count })
	opts.Schema = testenv.Schema(t, f.pool)
	f.schema = opts.Schema
	f.st = newStore(t, f.pool, opts)
	f.w = f.watermarks(t)
	f.ledger = pgx.Identifier{opts.Schema, "ledger"}.Sanitize()
	if _, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.ledger+" (key text PRIMARY KEY, amount int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	return f
}

// watermarks is another process's view of the store: its own cache.
func (f *wmFast) watermarks(t *testing.T) store.Transactional {
	t.Helper()
	w, err := f.st.KafkaWatermarks("g", func(context.Context, string, int32) (int64, error) { return 1 << 62, nil })
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func claimAt(t *testing.T, w store.Transactional, offset int64) store.TxResult {
	t.Helper()
	res, err := w.ClaimInTx(t.Context(), store.TxRequest{Scope: "g", Key: fmt.Sprintf("t/0/%d", offset), SuccessTTL: time.Hour, Wait: 10 * time.Second})
	if err != nil {
		t.Fatalf("claim of offset %d: %v", offset, err)
	}
	return res
}

// commitAt claims and commits offset, with no statement of a handler.
func commitAt(t *testing.T, w store.Transactional, offset int64) {
	t.Helper()
	res := claimAt(t, w, offset)
	if res.Decision != store.DecisionExecute {
		t.Fatalf("offset %d: decision %v, want execute", offset, res.Decision)
	}
	if err := res.Tx.Commit(t.Context(), nil); err != nil {
		t.Fatalf("offset %d: commit: %v", offset, err)
	}
}

func (f *wmFast) next(t *testing.T) int64 {
	t.Helper()
	ws, err := f.st.Watermarks(t.Context(), "g", "t")
	if err != nil || len(ws) != 1 {
		t.Fatalf("Watermarks = %+v, %v", ws, err)
	}
	return ws[0].Next
}

func (f *wmFast) has(t *testing.T, key string) bool {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.ledger+" WHERE key = $1", key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// Every way a handler can talk to its transaction works with BEGIN sent
// late: its writes commit with the watermark, or roll back with it, and the
// statements that can share BEGIN's round trip do, so that a message costs
// two round trips (the statement with BEGIN, the commit), and one with no
// statement at all.
func TestWatermarkFastPathLazyBegin(t *testing.T) {
	t.Parallel()
	f := newWMFast(t, postgres.Options{})
	commitAt(t, f.w, 0) // the pessimistic claim: the process knows the partition from here on
	insert := "INSERT INTO " + f.ledger + " (key, amount) VALUES ($1, 100)"
	for _, tc := range []struct {
		name string
		// roundTrips of the handler and the commit; 0: not checked
		// (BEGIN sent alone)
		roundTrips float64
		handle     func(ctx context.Context, tx pgx.Tx, key string) error
	}{
		{"exec", 2, func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, insert, key)
			return err
		}},
		{"exec named args", 2, func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+f.ledger+" (key, amount) VALUES (@key, 100)", pgx.NamedArgs{"key": key})
			return err
		}},
		{"exec of two statements", 0, func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, "INSERT INTO "+f.ledger+" (key, amount) VALUES ('"+key+"', 100); SELECT 1")
			return err
		}},
		{"exec simple protocol", 0, func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.Exec(ctx, insert, pgx.QueryExecModeSimpleProtocol, key)
			return err
		}},
		{"query row", 2, func(ctx context.Context, tx pgx.Tx, key string) error {
			var got string
			if err := tx.QueryRow(ctx, "INSERT INTO "+f.ledger+" (key, amount) VALUES ($1, 100) RETURNING key", key).Scan(&got); err != nil {
				return err
			}
			if got != key {
				return fmt.Errorf("RETURNING %q", got)
			}
			return nil
		}},
		{"query, rows closed", 0, func(ctx context.Context, tx pgx.Tx, key string) error {
			rows, err := tx.Query(ctx, "WITH i AS (INSERT INTO "+f.ledger+" (key, amount) VALUES ($1, 100) RETURNING key) SELECT key FROM i UNION ALL SELECT 'two'", key)
			if err != nil {
				return err
			}
			var n int
			for rows.Next() {
				n++
				if n == 1 {
					break // closed before the end
				}
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return err
			}
			// The connection is free again for the next statement.
			var one int
			return tx.QueryRow(ctx, "SELECT 1").Scan(&one)
		}},
		{"query, rows read to the end", 0, func(ctx context.Context, tx pgx.Tx, key string) error {
			rows, err := tx.Query(ctx, "WITH i AS (INSERT INTO "+f.ledger+" (key, amount) VALUES ($1, 100) RETURNING key) SELECT key FROM i UNION ALL SELECT 'two'", key)
			if err != nil {
				return err
			}
			keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil || len(keys) != 2 || keys[0] != key {
				return fmt.Errorf("rows %v, %v", keys, err)
			}
			return nil
		}},
		{"query alone", 2, func(ctx context.Context, tx pgx.Tx, key string) error {
			rows, err := tx.Query(ctx, "INSERT INTO "+f.ledger+" (key, amount) VALUES ($1, 100) RETURNING key", key)
			if err != nil {
				return err
			}
			for rows.Next() {
			}
			return rows.Err()
		}},
		{"send batch", 2, func(ctx context.Context, tx pgx.Tx, key string) error {
			b := &pgx.Batch{}
			b.Queue(insert, key)
			var got int
			b.Queue("SELECT amount FROM "+f.ledger+" WHERE key = $1", key).QueryRow(func(row pgx.Row) error { return row.Scan(&got) })
			if err := tx.SendBatch(ctx, b).Close(); err != nil {
				return err
			}
			if got != 100 {
				return fmt.Errorf("the batch's callback read %d", got)
			}
			return nil
		}},
		{"copy from", 0, func(ctx context.Context, tx pgx.Tx, key string) error {
			_, err := tx.CopyFrom(ctx, pgx.Identifier{f.schema, "ledger"}, []string{"key", "amount"}, pgx.CopyFromRows([][]any{{key, 100}}))
			return err
		}},
		{"savepoint", 0, func(ctx context.Context, tx pgx.Tx, key string) error {
			sp, err := tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insert, key+"-undone"); err != nil {
				return err
			}
			if err := sp.Rollback(ctx); err != nil { // back to the savepoint
				return err
			}
			sp, err = tx.Begin(ctx)
			if err != nil {
				return err
			}
			if _, err := sp.Exec(ctx, insert, key); err != nil {
				return err
			}
			return sp.Commit(ctx) // released
		}},
		{"no statement", 1, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			offset := f.next(t)
			for _, commit := range []bool{false, true} {
				before := f.count.load()
				res := claimAt(t, f.w, offset)
				if res.Decision != store.DecisionExecute || res.Claim.Attempt != 1 {
					t.Fatalf("decision %v, attempt %d", res.Decision, res.Claim.Attempt)
				}
				if rt := f.count.load().minus(before).roundTrips; rt != 0 {
					t.Fatalf("the claim made %v round trips; the fast path makes none", rt)
				}
				key := fmt.Sprintf("%s-%d-%v", tc.name, offset, commit)
				if tc.handle != nil {
					tx, _ := postgres.TxFromContext(res.Tx.Context(ctx))
					if err := tc.handle(ctx, tx, key); err != nil {
						t.Fatalf("handler: %v", err)
					}
				}
				if !commit {
					if err := res.Tx.Rollback(ctx); err != nil {
						t.Fatal(err)
					}
					if f.has(t, key) || f.next(t) != offset {
						t.Fatalf("after a rollback: the row is there (%v), or the watermark moved to %d from %d", f.has(t, key), f.next(t), offset)
					}
					// The rollback forgot the partition: take the
					// pessimistic path once to know it again.
					commitAt(t, f.w, offset)
					offset++
					continue
				}
				if err := res.Tx.Commit(ctx, nil); err != nil {
					t.Fatalf("commit: %v", err)
				}
				if rt := f.count.load().minus(before).roundTrips; tc.roundTrips != 0 && rt != tc.roundTrips {
					t.Fatalf("%v round trips, want %v", rt, tc.roundTrips)
				}
				if tc.handle != nil && !f.has(t, key) || f.has(t, key+"-undone") {
					t.Fatalf("after the commit: the handler's row %v, the rolled-back savepoint's %v", f.has(t, key), f.has(t, key+"-undone"))
				}
				if n := f.next(t); n != offset+1 {
					t.Fatalf("watermark %d after committing offset %d", n, offset)
				}
			}
		})
	}
}

// A stale cache: another owner committed the offset after this process's
// last commit. The fast path runs the handler, its commit finds the
// watermark moved, nothing commits, and the store says so with
// store.ErrLeaseLost; the next claim of the partition is pessimistic and
// answers the duplicate from the row.
func TestWatermarkFastPathStaleCache(t *testing.T) {
	t.Parallel()
	f := newWMFast(t, postgres.Options{})
	ctx := t.Context()
	commitAt(t, f.w, 0) // this process knows watermark 1
	other := f.watermarks(t)
	commitAt(t, other, 1) // another owner moves it to 2

	res := claimAt(t, f.w, 1)
	if res.Decision != store.DecisionExecute {
		t.Fatalf("decision %v: the fast path executes", res.Decision)
	}
	tx, _ := postgres.TxFromContext(res.Tx.Context(ctx))
	if _, err := tx.Exec(ctx, "INSERT INTO "+f.ledger+" (key, amount) VALUES ('stale', 100)"); err != nil {
		t.Fatal(err)
	}
	if err := res.Tx.Commit(ctx, []byte("x")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("commit over a moved watermark: %v, want store.ErrLeaseLost", err)
	}
	if f.has(t, "stale") || f.next(t) != 2 {
		t.Fatalf("the stale commit committed: row %v, watermark %d", f.has(t, "stale"), f.next(t))
	}
	if res := claimAt(t, f.w, 1); res.Decision != store.DecisionReplay {
		t.Fatalf("the claim after the lost commit: %v, want replay", res.Decision)
	}
	// The duplicate left the cache empty; the next offset goes the
	// pessimistic way and fills it.
	commitAt(t, f.w, 2)
	before := f.count.load()
	commitAt(t, f.w, 3)
	if rt := f.count.load().minus(before).roundTrips; rt != 1 {
		t.Fatalf("a fast claim and commit without statements made %v round trips, want 1", rt)
	}
}

// The fast path's commit defers to the row when another owner counted an
// attempt of the offset after this process's last commit: the commit finds
// an attempt counted (and here a pause), nothing commits, the store says so
// with store.ErrLeaseLost, and the pessimistic claim decides from the row:
// held back by the pause, then the second attempt.
func TestWatermarkFastPathDefersToAttempts(t *testing.T) {
	t.Parallel()
	f := newWMFast(t, postgres.Options{})
	ctx := t.Context()
	const pause = time.Minute
	commitAt(t, f.w, 0) // this process knows watermark 1
	rollBackAt(t, f.watermarks(t), 1, 1, store.Completion{Status: store.StatusRetryable, TTL: time.Hour, RetryAfter: pause})

	res := claimAt(t, f.w, 1)
	if res.Decision != store.DecisionExecute {
		t.Fatalf("decision %v: the fast path executes", res.Decision)
	}
	if err := res.Tx.Commit(ctx, nil); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("commit over another owner's attempt: %v, want store.ErrLeaseLost", err)
	}
	if n := f.next(t); n != 1 || f.retryAt(t) == nil {
		t.Fatalf("the fast commit moved the watermark to %d past the pause", n)
	}
	heldAt(t, f.w, 1, 1, pause)
	f.passPause(t, pause)
	res = claimAt(t, f.w, 1)
	if res.Decision != store.DecisionExecute || res.Claim.Attempt != 2 {
		t.Fatalf("after the pause: %v at attempt %d, want execute at attempt 2", res.Decision, res.Claim.Attempt)
	}
	if err := res.Tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if ws, err := f.st.Watermarks(ctx, "g", "t"); err != nil || ws[0].Next != 2 || ws[0].AttemptOffset != 1 || ws[0].Attempts != 2 {
		t.Fatalf("after the second attempt: %+v, %v", ws, err)
	}
	// The fast path again: the row as a first attempt leaves it.
	res = claimAt(t, f.w, 2)
	if res.Claim.Attempt != 1 {
		t.Fatalf("offset 2: attempt %d, want 1", res.Claim.Attempt)
	}
	if err := res.Tx.Commit(ctx, []byte("out")); err != nil {
		t.Fatal(err)
	}
	ws, err := f.st.Watermarks(ctx, "g", "t")
	if err != nil || ws[0].Next != 3 || ws[0].LastOffset != 2 || ws[0].AttemptOffset != 2 || ws[0].Attempts != 1 || ws[0].LastStatus != store.StatusSucceeded {
		t.Fatalf("after the fast commit of offset 2: %+v, %v", ws, err)
	}
	if res := claimAt(t, f.w, 2); res.Decision != store.DecisionReplay || string(res.Record.Result) != "out" || res.Record.Attempt != 1 {
		t.Fatalf("offset 2's redelivery: %v, %+v; want its produced messages replayed at attempt 1", res.Decision, res.Record)
	}
}

// Only the offset right after the process's own commit takes the fast
// path: one further on (a gap, or offsets another owner handled before a
// rebalance brought the partition back) is claimed the pessimistic way, in
// BEGIN's round trip, and the watermark moves past it.
func TestWatermarkFastPathOnlyTheNextOffset(t *testing.T) {
	t.Parallel()
	f := newWMFast(t, postgres.Options{})
	commitAt(t, f.w, 0) // this process knows watermark 1
	before := f.count.load()
	res := claimAt(t, f.w, 3)
	if res.Decision != store.DecisionExecute {
		t.Fatalf("offset 3: decision %v, want execute", res.Decision)
	}
	if rt := f.count.load().minus(before).roundTrips; rt != 1 {
		t.Fatalf("the claim of offset 3 after offset 0 made %v round trips, want 1 (the pessimistic claim)", rt)
	}
	if err := res.Tx.Commit(t.Context(), nil); err != nil {
		t.Fatal(err)
	}
	if n := f.next(t); n != 4 {
		t.Fatalf("watermark %d after offset 3, want 4", n)
	}
	before = f.count.load()
	commitAt(t, f.w, 4) // the next offset: the fast path again
	if rt := f.count.load().minus(before).roundTrips; rt != 1 {
		t.Fatalf("a fast claim and commit without statements made %v round trips, want 1", rt)
	}
}

// Under repeatable read the fast path's snapshot begins with the handler's
// first statement; another owner's commit of the row after it makes the
// commit function fail with a serialization failure, which is a lost claim
// too: nothing commits.
func TestWatermarkFastPathRepeatableRead(t *testing.T) {
	t.Parallel()
	f := newWMFast(t, postgres.Options{TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead}})
	ctx := t.Context()
	commitAt(t, f.w, 0)
	res := claimAt(t, f.w, 1)
	tx, _ := postgres.TxFromContext(res.Tx.Context(ctx))
	if _, err := tx.Exec(ctx, "INSERT INTO "+f.ledger+" (key, amount) VALUES ('rr', 100)"); err != nil {
		t.Fatal(err)
	}
	commitAt(t, f.watermarks(t), 1)
	if err := res.Tx.Commit(ctx, nil); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("commit after another owner's: %v, want store.ErrLeaseLost", err)
	}
	if f.has(t, "rr") || f.next(t) != 2 {
		t.Fatalf("row %v, watermark %d", f.has(t, "rr"), f.next(t))
	}
}

// Two owners run the same offset on the fast path at once (a rebalance):
// the row's lock orders their commits; the first commits, the second's
// commit rolls back and its delivery replays the first's produced message.
// One effect, no failed attempt, no nack.
func TestWatermarkFastPathTwoOwners(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{HeldKeyTimeout: 20 * time.Second})
	b := f.owner(t, policy.Policy{HeldKeyTimeout: 20 * time.Second, NackDelay: -1, AttemptDelay: -1})
	// B commits offset 0, A offset 1: each knows the partition, B's
	// knowledge stale; both take the fast path for offset 2.
	if _, err := b(wmMsg(0, 0)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.deliver(0, 1); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted {
			t.Fatalf("offsets 0 and 1: %+v", e)
		}
	}
	var entered sync.WaitGroup
	entered.Add(2)
	both := make(chan struct{})
	f.hold = func(msg *message.Message) {
		if msg.UUID == "p0-o2" {
			entered.Done()
			<-both
		}
	}
	outs := make(chan []*message.Message, 2)
	for _, h := range []message.HandlerFunc{f.h, b} {
		go func() {
			out, err := h(wmMsg(0, 2))
			if err != nil {
				t.Error(err)
			}
			outs <- out
		}()
	}
	waitGroup(t, &entered) // both handlers ran: neither claim waited
	close(both)
	for range 2 {
		select {
		case out := <-outs:
			if len(out) != 1 || out[0].UUID != "out-p0-o2" {
				t.Fatalf("an owner got %v, want the produced message of offset 2", out)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("a delivery did not end")
		}
	}
	got := map[pipeline.Outcome]pipeline.Event{}
	for range 2 {
		e := f.event(t)
		got[e.Outcome] = e
	}
	if _, ok := got[pipeline.OutcomeExecuted]; !ok || !got[pipeline.OutcomeReplayed].Contended {
		t.Fatalf("events %+v, want one executed and one replayed (contended)", got)
	}
	if n := f.ledgerRows(t); n != 3 {
		t.Fatalf("ledger holds %d rows, want 3 (offsets 0, 1, 2 once)", n)
	}
	if w := f.watermark(t, 0); w.Next != 3 || w.LastOffset != 2 || w.Attempts != 1 {
		t.Fatalf("watermark %+v", w)
	}
}

// A stale cache at the stage: the process that last committed offset 0
// gets offset 1 again after another owner committed it; its handler runs,
// rolls back with the lost commit, and the delivery is a replay.
func TestWatermarkFastPathStaleCacheReplays(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{MaxAttempts: 2})
	b := f.owner(t, policy.Policy{MaxAttempts: 2, NackDelay: -1, AttemptDelay: -1})
	if _, err := f.deliver(0, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := b(wmMsg(0, 1)); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		f.event(t)
	}
	out, err := f.deliver(0, 1)
	if err != nil || len(out) != 1 || out[0].UUID != "out-p0-o1" {
		t.Fatalf("the stale owner got %v, %v; want the replay of offset 1", out, err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeReplayed || e.Err != nil {
		t.Fatalf("event %+v, want a replay", e)
	}
	if n := f.ledgerRows(t); n != 2 {
		t.Fatalf("ledger holds %d rows, want 2", n)
	}
	if w := f.watermark(t, 0); w.Next != 2 || w.Attempts != 1 {
		t.Fatalf("watermark %+v", w)
	}
}

func waitGroup(t *testing.T, wg *sync.WaitGroup) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the handlers did not both run")
	}
}

// A pessimistic claim that waited for another owner's transaction on the
// partition's row says so (TxResult.Contended); one that did not wait does
// not.
func TestWatermarkClaimContended(t *testing.T) {
	t.Parallel()
	f := newWMFast(t, postgres.Options{})
	ctx := t.Context()
	commitAt(t, f.watermarks(t), 0)
	holder := claimAt(t, f.watermarks(t), 1) // pessimistic: a process that knows nothing
	if holder.Decision != store.DecisionExecute || holder.Contended {
		t.Fatalf("the first owner: %v, contended %v", holder.Decision, holder.Contended)
	}
	waiter := make(chan store.TxResult, 1)
	go func() { waiter <- claimAt(t, f.watermarks(t), 1) }()
	waitForLockWait(t, f.pool, f.schema)
	if err := holder.Tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case res := <-waiter:
		if res.Decision != store.DecisionReplay || !res.Contended {
			t.Fatalf("the waiting owner: %v, contended %v; want a contended replay", res.Decision, res.Contended)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting claim did not end")
	}
}
