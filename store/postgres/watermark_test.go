package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// The tests of the watermark mode read a message's position from its
// metadata (wmPosition), as kafkakeys.Position reads it from
// watermill-kafka's message context: the store and the stage see the same
// store.KafkaPosition either way; integration/ runs the mode on Kafka.

const wmGroup = "billing"

func wmPosition(msg *message.Message) (store.KafkaPosition, error) {
	p, err1 := strconv.ParseInt(msg.Metadata.Get("partition"), 10, 32)
	o, err2 := strconv.ParseInt(msg.Metadata.Get("offset"), 10, 64)
	if err1 != nil || err2 != nil {
		return store.KafkaPosition{}, fmt.Errorf("%w: no position", keygen.ErrNoKey)
	}
	return store.KafkaPosition{Topic: "payments", Partition: int32(p), Offset: o}, nil
}

// wmFixture is a ledger, as ledgerFixture's, behind the watermark mode.
type wmFixture struct {
	pool   *pgxpool.Pool
	schema string
	s      *postgres.Store
	ledger string
	// fail, when set, is the handler's error after its ledger insert.
	fail func(msg *message.Message) error
	// hold, when set, is called inside the transaction after the insert.
	hold    func(msg *message.Message)
	hwm     atomic.Int64
	hwmAsks atomic.Int32
	events  chan pipeline.Event
	h       message.HandlerFunc
}

func newWMFixture(t *testing.T, p policy.Policy) *wmFixture {
	t.Helper()
	f := &wmFixture{pool: testenv.Pool(t, func(c *pgxpool.Config) { c.MaxConns = 8 }), events: make(chan pipeline.Event, 4096)}
	f.hwm.Store(1 << 62)
	f.schema = testenv.Schema(t, f.pool)
	f.s = newStore(t, f.pool, postgres.Options{Schema: f.schema})
	f.ledger = pgx.Identifier{f.schema, "ledger"}.Sanitize()
	if _, err := f.pool.Exec(t.Context(), "CREATE TABLE "+f.ledger+" (id bigserial PRIMARY KEY, message_uuid text NOT NULL, amount int NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	p.NackDelay, p.AttemptDelay = -1, -1
	f.h = f.owner(t, p)
	return f
}

// owner builds a stage over the fixture's store, as another process would:
// with a watermark cache of its own. Its events go to f.events.
func (f *wmFixture) owner(t *testing.T, p policy.Policy) message.HandlerFunc {
	t.Helper()
	r, err := receiver.NewTransactional(f.s).
		WithKafkaWatermark(pipeline.KafkaWatermark{
			Group:    wmGroup,
			Position: wmPosition,
			HighWaterMark: func(context.Context, string, int32) (int64, error) {
				f.hwmAsks.Add(1)
				return f.hwm.Load(), nil
			},
		}).
		WithPolicy(p).
		WithLogger(slog.New(slog.DiscardHandler)).
		WithEventHandler(func(e pipeline.Event) { f.events <- e }).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	return r.Middleware(func(msg *message.Message) ([]*message.Message, error) {
		tx, ok := postgres.TxFromContext(msg.Context())
		if !ok {
			return nil, errors.New("handler: no transaction in the context")
		}
		if _, err := tx.Exec(msg.Context(), "INSERT INTO "+f.ledger+" (message_uuid, amount) VALUES ($1, 100)", msg.UUID); err != nil {
			return nil, err
		}
		if f.hold != nil {
			f.hold(msg)
		}
		if f.fail != nil {
			if err := f.fail(msg); err != nil {
				return nil, err
			}
		}
		return []*message.Message{message.NewMessage("out-"+msg.UUID, []byte("booked"))}, nil
	})
}

// msg is the message at (partition, offset); its UUID names them, so a
// redelivery has the UUID of the first delivery, as on Kafka.
func wmMsg(partition int32, offset int64) *message.Message {
	m := message.NewMessage(fmt.Sprintf("p%d-o%d", partition, offset), []byte("pay 100"))
	m.Metadata.Set("partition", strconv.Itoa(int(partition)))
	m.Metadata.Set("offset", strconv.FormatInt(offset, 10))
	return m
}

func (f *wmFixture) deliver(partition int32, offset int64) ([]*message.Message, error) {
	return f.h(wmMsg(partition, offset))
}

func (f *wmFixture) event(t *testing.T) pipeline.Event {
	t.Helper()
	select {
	case e := <-f.events:
		return e
	case <-time.After(30 * time.Second):
		t.Fatal("no event")
		return pipeline.Event{}
	}
}

func (f *wmFixture) ledgerRows(t *testing.T) int {
	t.Helper()
	var n int
	if err := f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.ledger).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// watermark returns the row of partition p.
func (f *wmFixture) watermark(t *testing.T, p int32) postgres.Watermark {
	t.Helper()
	ws, err := f.s.Watermarks(t.Context(), wmGroup, "payments")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ws {
		if w.Partition == p {
			return w
		}
	}
	t.Fatalf("no watermark row for partition %d in %+v", p, ws)
	return postgres.Watermark{}
}

func TestWatermarkDecisions(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{})

	for o := range int64(3) {
		out, err := f.deliver(0, o)
		if err != nil || len(out) != 1 || out[0].UUID != fmt.Sprintf("out-p0-o%d", o) {
			t.Fatalf("offset %d: %v, %v", o, out, err)
		}
		if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 1 || e.Key != fmt.Sprintf("payments/0/%d", o) || e.Scope != wmGroup {
			t.Fatalf("offset %d: event %+v", o, e)
		}
	}
	if w := f.watermark(t, 0); w.Next != 3 || w.LastOffset != 2 || w.LastStatus != store.StatusSucceeded || w.LastMessageUUID != "p0-o2" {
		t.Fatalf("after offsets 0-2: %+v", w)
	}

	// The last committed offset again: its produced message is replayed
	// with its UUID and payload (a crash between commit and publish).
	out, err := f.deliver(0, 2)
	if err != nil || len(out) != 1 || out[0].UUID != "out-p0-o2" || string(out[0].Payload) != "booked" {
		t.Fatalf("redelivery of the last offset: %v, %v", out, err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeReplayed {
		t.Fatalf("redelivery of the last offset: %+v", e)
	}
	// An older offset: its produced messages were published before the
	// next message was handed over; acked with nothing to publish.
	out, err = f.deliver(0, 0)
	if err != nil || len(out) != 0 {
		t.Fatalf("redelivery of an older offset: %v, %v", out, err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeReplayed {
		t.Fatalf("redelivery of an older offset: %+v", e)
	}
	// A gap (compaction, transaction markers): the next offset present runs.
	if _, err := f.deliver(0, 10); err != nil {
		t.Fatal(err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted {
		t.Fatalf("offset after a gap: %+v", e)
	}
	if _, err := f.deliver(0, 7); err != nil {
		t.Fatal(err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeReplayed {
		t.Fatalf("an offset inside the gap: %+v", e)
	}
	// Another partition has its own watermark.
	if _, err := f.deliver(1, 0); err != nil {
		t.Fatal(err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted {
		t.Fatalf("partition 1: %+v", e)
	}
	if w := f.watermark(t, 0); w.Next != 11 || w.LastOffset != 10 {
		t.Fatalf("partition 0 after the gap: %+v", w)
	}
	if n := f.ledgerRows(t); n != 5 {
		t.Fatalf("ledger holds %d rows, want 5 (offsets 0, 1, 2, 10 of partition 0 and 0 of partition 1)", n)
	}
	var records int
	if err := f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+table(f.schema, "")).Scan(&records); err != nil {
		t.Fatal(err)
	}
	if records != 0 {
		t.Fatalf("the records table holds %d rows; the watermark mode writes none", records)
	}
}

func TestWatermarkRollbackLeavesTheWatermark(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{MaxAttempts: 5})
	if _, err := f.deliver(0, 0); err != nil {
		t.Fatal(err)
	}
	f.event(t)
	boom := errors.New("ledger service down")
	f.fail = func(*message.Message) error { return boom }
	for attempt := 1; attempt <= 2; attempt++ {
		if _, err := f.deliver(0, 1); !errors.Is(err, boom) {
			t.Fatalf("attempt %d: %v, want the handler's error (a nack)", attempt, err)
		}
		if e := f.event(t); e.Outcome != pipeline.OutcomeReleased || e.Attempt != attempt {
			t.Fatalf("attempt %d: %+v", attempt, e)
		}
		w := f.watermark(t, 0)
		if w.Next != 1 || w.LastOffset != 0 || w.AttemptOffset != 1 || w.Attempts != attempt {
			t.Fatalf("after failed attempt %d: %+v, want the watermark at 1 and %d attempts of offset 1", attempt, w, attempt)
		}
	}
	if n := f.ledgerRows(t); n != 1 {
		t.Fatalf("ledger holds %d rows after two rolled-back attempts, want 1", n)
	}
	f.fail = nil
	out, err := f.deliver(0, 1)
	if err != nil || len(out) != 1 {
		t.Fatalf("third attempt: %v, %v", out, err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 3 {
		t.Fatalf("third attempt: %+v, want executed at attempt 3", e)
	}
	if w := f.watermark(t, 0); w.Next != 2 || w.LastOffset != 1 {
		t.Fatalf("after the success: %+v", w)
	}
}

func TestWatermarkFirstMessageFails(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{MaxAttempts: 5})
	f.fail = func(*message.Message) error { return errors.New("down") }
	if _, err := f.deliver(3, 42); err == nil {
		t.Fatal("want the handler's error")
	}
	f.event(t)
	if w := f.watermark(t, 3); w.Next != 42 || w.LastOffset != -1 || w.Attempts != 1 {
		t.Fatalf("after a failed first message: %+v, want a row at watermark 42 with 1 attempt", w)
	}
	f.fail = nil
	if _, err := f.deliver(3, 42); err != nil {
		t.Fatal(err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 2 {
		t.Fatalf("second attempt: %+v", e)
	}
}

func TestWatermarkAttemptCap(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{MaxAttempts: 2, Exhausted: policy.ExhaustedDrop})
	f.fail = func(*message.Message) error { return errors.New("always down") }
	if _, err := f.deliver(0, 5); err == nil {
		t.Fatal("first attempt: want a nack")
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeReleased {
		t.Fatalf("first attempt: %+v", e)
	}
	if _, err := f.deliver(0, 5); err != nil {
		t.Fatalf("last attempt: %v, want an ack (dropped)", err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeCachedFailure || !e.Exhausted || e.Attempt != 2 {
		t.Fatalf("last attempt: %+v, want a cached failure, exhausted at attempt 2", e)
	}
	w := f.watermark(t, 5-5)
	if w.Next != 6 || w.LastOffset != 5 || w.LastStatus != store.StatusCachedFailure || w.LastErrorKind != store.ErrorKindAttemptsExhausted {
		t.Fatalf("after the exhausted attempt: %+v, want the watermark past 5 and the failure recorded", w)
	}
	// Its redelivery gets the cached failure, without running.
	out, err := f.deliver(0, 5)
	if err != nil || len(out) != 0 {
		t.Fatalf("redelivery: %v, %v", out, err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeCachedFailureReplayed {
		t.Fatalf("redelivery: %+v", e)
	}
	if n := f.ledgerRows(t); n != 0 {
		t.Fatalf("ledger holds %d rows, want 0", n)
	}
	// The next offset runs.
	f.fail = nil
	if _, err := f.deliver(0, 6); err != nil {
		t.Fatal(err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted || e.Attempt != 1 {
		t.Fatalf("next offset: %+v", e)
	}
}

func TestWatermarkCachedFailure(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{})
	f.fail = func(*message.Message) error { return policy.Cached(errors.New("card declined")) }
	if _, err := f.deliver(2, 0); err != nil {
		t.Fatalf("cached failure: %v, want an ack", err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeCachedFailure {
		t.Fatalf("cached failure: %+v", e)
	}
	f.fail = nil
	if _, err := f.deliver(2, 0); err != nil {
		t.Fatal(err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeCachedFailureReplayed {
		t.Fatalf("its redelivery: %+v", e)
	}
	if w := f.watermark(t, 2); w.Next != 1 || w.LastStatus != store.StatusCachedFailure || w.LastErrorKind != store.ErrorKindCached {
		t.Fatalf("row: %+v", w)
	}
	if n := f.ledgerRows(t); n != 0 {
		t.Fatalf("ledger holds %d rows, want 0", n)
	}
}

// Two owners of a partition during a rebalance: the old one still runs
// offset N in its transaction when the new one receives N. The new one's
// claim waits on the partition's row, then finds the watermark past N and
// replays what the old one produced.
func TestWatermarkTwoOwners(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{HeldKeyTimeout: 20 * time.Second})
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	f.hold = func(*message.Message) {
		once.Do(func() {
			close(entered)
			<-release
		})
	}
	firstDone := make(chan error, 1)
	go func() {
		_, err := f.deliver(0, 0)
		firstDone <- err
	}()
	select {
	case <-entered:
	case err := <-firstDone:
		t.Fatalf("the first delivery ended without running the handler: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the first delivery never ran the handler")
	}
	secondDone := make(chan []*message.Message, 1)
	go func() {
		out, err := f.deliver(0, 0)
		if err != nil {
			t.Error(err)
		}
		secondDone <- out
	}()
	waitForLockWait(t, f.pool, f.schema)
	close(release)
	var out []*message.Message
	for _, done := range []func() bool{
		func() bool {
			select {
			case err := <-firstDone:
				if err != nil {
					t.Fatal(err)
				}
				return true
			case <-time.After(30 * time.Second):
				return false
			}
		},
		func() bool {
			select {
			case out = <-secondDone:
				return true
			case <-time.After(30 * time.Second):
				return false
			}
		},
	} {
		if !done() {
			t.Fatal("a delivery did not end within 30s")
		}
	}
	if len(out) != 1 || out[0].UUID != "out-p0-o0" {
		t.Fatalf("second owner got %v, want the first owner's produced message", out)
	}
	// The two events come in either order: the second owner's claim ends
	// with the first's COMMIT, before the first's stage has reported.
	var outcomes []pipeline.Outcome
	var second pipeline.Event
	for range 2 {
		e := f.event(t)
		outcomes = append(outcomes, e.Outcome)
		if e.Outcome == pipeline.OutcomeReplayed {
			second = e
		}
	}
	if !slices.Contains(outcomes, pipeline.OutcomeExecuted) || !slices.Contains(outcomes, pipeline.OutcomeReplayed) {
		t.Fatalf("outcomes %v, want one executed and one replayed", outcomes)
	}
	if !second.Contended {
		t.Fatalf("the second owner's claim waited for the first's lock, and its event says it was not contended: %+v", second)
	}
	if n := f.ledgerRows(t); n != 1 {
		t.Fatalf("ledger holds %d rows, want 1", n)
	}
}

func TestWatermarkAheadOfHighWaterMark(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{})
	for o := range int64(5) {
		if _, err := f.deliver(0, o); err != nil {
			t.Fatal(err)
		}
		f.event(t)
	}
	if f.hwmAsks.Load() != 0 {
		t.Fatalf("the high-water mark was asked %d times on the hot path, want 0", f.hwmAsks.Load())
	}
	// The topic was recreated: offset 0 again, the partition holds 2 records.
	f.hwm.Store(2)
	for range 2 {
		_, err := f.deliver(0, 0)
		if !errors.Is(err, store.ErrWatermarkAhead) {
			t.Fatalf("err = %v, want ErrWatermarkAhead", err)
		}
		if e := f.event(t); e.Outcome != pipeline.OutcomeStoreFailed {
			t.Fatalf("event %+v, want a store failure (nacked: nothing acked unrun)", e)
		}
	}
	if n := f.ledgerRows(t); n != 5 {
		t.Fatalf("ledger holds %d rows, want 5", n)
	}
	// The operator moves the watermark; the new topic's offsets run.
	prev, existed, err := f.s.MoveWatermark(t.Context(), wmGroup, "payments", 0, 0, false)
	if err != nil || !existed || prev != 5 {
		t.Fatalf("MoveWatermark = %d, %v, %v; want the old watermark 5", prev, existed, err)
	}
	if _, err := f.deliver(0, 0); err != nil {
		t.Fatal(err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted {
		t.Fatalf("after the move: %+v", e)
	}
	// A duplicate now passes the check, which is not asked again.
	asks := f.hwmAsks.Load()
	for range 3 {
		if _, err := f.deliver(0, 0); err != nil {
			t.Fatal(err)
		}
		if e := f.event(t); e.Outcome != pipeline.OutcomeReplayed {
			t.Fatalf("duplicate after the move: %+v", e)
		}
	}
	if got := f.hwmAsks.Load() - asks; got != 1 {
		t.Fatalf("the high-water mark was asked %d times for three duplicates, want once per partition", got)
	}
}

// The table holds one row per partition, whatever the message count.
func TestWatermarkOneRowPerPartition(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{})
	const partitions, perPartition = 4, 250
	var wg sync.WaitGroup
	for p := range int32(partitions) {
		wg.Go(func() {
			for o := range int64(perPartition) {
				if _, err := f.deliver(p, o); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	var rows int
	wmTable := pgx.Identifier{f.schema, postgres.DefaultTable + "_watermarks"}.Sanitize()
	if err := f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+wmTable).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != partitions {
		t.Fatalf("the watermark table holds %d rows after %d messages, want %d", rows, partitions*perPartition, partitions)
	}
	if n := f.ledgerRows(t); n != partitions*perPartition {
		t.Fatalf("ledger holds %d rows, want %d", n, partitions*perPartition)
	}
	for p := range int32(partitions) {
		if w := f.watermark(t, p); w.Next != perPartition {
			t.Fatalf("partition %d: %+v", p, w)
		}
	}
}

// A message without a position has no key: rejected (acked, not run) as
// policy.MissingKey says, never a nack loop.
func TestWatermarkMessageWithoutPosition(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{})
	if _, err := f.h(message.NewMessage("no-kafka", []byte("x"))); err != nil {
		t.Fatalf("err = %v, want an ack", err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeRejected || !errors.Is(e.Err, keygen.ErrNoKey) {
		t.Fatalf("event %+v, want rejected for no key", e)
	}
}

// hiddenWatermarks is a one-transaction store without Kafka watermarks.
type hiddenWatermarks struct{ store.Transactional }

func TestWatermarkBuilderRefusals(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := newStore(t, pool, postgres.Options{})
	hwm := func(context.Context, string, int32) (int64, error) { return 0, nil }
	good := pipeline.KafkaWatermark{Group: "g", Position: wmPosition, HighWaterMark: hwm}
	for _, tc := range []struct {
		name    string
		b       *receiver.Builder
		setting string
	}{
		{"no group", receiver.NewTransactional(s).WithKafkaWatermark(pipeline.KafkaWatermark{Position: wmPosition, HighWaterMark: hwm}), "WithKafkaWatermark"},
		{"no position", receiver.NewTransactional(s).WithKafkaWatermark(pipeline.KafkaWatermark{Group: "g", HighWaterMark: hwm}), "WithKafkaWatermark"},
		{"no high-water mark", receiver.NewTransactional(s).WithKafkaWatermark(pipeline.KafkaWatermark{Group: "g", Position: wmPosition}), "WithKafkaWatermark"},
		{"key generator", receiver.NewTransactional(s).WithKafkaWatermark(good).WithKeyGenerator(keygen.UUID()), "WithKeyGenerator"},
		{"fingerprint", receiver.NewTransactional(s).WithKafkaWatermark(good).WithFingerprint(keygen.NoFingerprint), "WithFingerprint"},
		{"scope", receiver.NewTransactional(s).WithKafkaWatermark(good).WithScope("x"), "WithScope"},
		{"store without watermarks", receiver.NewTransactional(hiddenWatermarks{s}).WithKafkaWatermark(good), "WithKafkaWatermark"},
		{"lease mode", receiver.New(s).WithKafkaWatermark(good), "WithKafkaWatermark"},
	} {
		_, err := tc.b.Build()
		var ce *oncemill.ConfigError
		if !errors.As(err, &ce) || ce.Setting != tc.setting {
			t.Errorf("%s: Build() = %v, want a ConfigError of %s", tc.name, err, tc.setting)
		}
	}
	if _, err := receiver.NewTransactional(s).WithKafkaWatermark(good).Build(); err != nil {
		t.Fatalf("a good configuration: %v", err)
	}
}

func TestWatermarksAndMove(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := newStore(t, pool, postgres.Options{})
	ctx := t.Context()
	if _, _, err := s.MoveWatermark(ctx, "g", "t", 3, 100, false); !errors.Is(err, store.ErrNotFound) || !strings.Contains(err.Error(), `group "g" topic "t" partition 3`) {
		t.Fatalf("MoveWatermark of a partition without a row, without create: %v, want store.ErrNotFound naming it", err)
	}
	if ws, err := s.Watermarks(ctx, "", ""); err != nil || len(ws) != 0 {
		t.Fatalf("a refused move created a row: %+v, %v", ws, err)
	}
	prev, existed, err := s.MoveWatermark(ctx, "g", "t", 3, 100, true)
	if err != nil || existed || prev != 0 {
		t.Fatalf("MoveWatermark of a new partition = %d, %v, %v", prev, existed, err)
	}
	prev, existed, err = s.MoveWatermark(ctx, "g", "t", 3, 40, false)
	if err != nil || !existed || prev != 100 {
		t.Fatalf("MoveWatermark back = %d, %v, %v", prev, existed, err)
	}
	if _, _, err := s.MoveWatermark(ctx, "g", "t", 3, -1, false); !errors.Is(err, store.ErrInvalidRequest) {
		t.Fatalf("a negative offset: %v", err)
	}
	ws, err := s.Watermarks(ctx, "", "")
	if err != nil || len(ws) != 1 || ws[0].Next != 40 || ws[0].Group != "g" || ws[0].Topic != "t" || ws[0].Partition != 3 || ws[0].LastOffset != -1 {
		t.Fatalf("Watermarks = %+v, %v", ws, err)
	}
	if ws, err := s.Watermarks(ctx, "other", ""); err != nil || len(ws) != 0 {
		t.Fatalf("Watermarks of another group = %+v, %v", ws, err)
	}
}

// DeleteWatermark removes one partition's row and returns its watermark;
// a partition without a row is store.ErrNotFound; the partition's next
// claim starts it again at the offset it claims.
func TestDeleteWatermark(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{})
	ctx := t.Context()
	for _, p := range []int32{0, 1} {
		if _, _, err := f.s.MoveWatermark(ctx, wmGroup, "payments", p, 50, true); err != nil {
			t.Fatal(err)
		}
	}
	// Offset 7 is below the watermark: a duplicate, acked unrun.
	if _, err := f.deliver(0, 7); err != nil {
		t.Fatal(err)
	}
	f.event(t)
	if n := f.ledgerRows(t); n != 0 {
		t.Fatalf("offset 7 below the watermark ran: %d ledger rows", n)
	}
	prev, err := f.s.DeleteWatermark(ctx, wmGroup, "payments", 0)
	if err != nil || prev != 50 {
		t.Fatalf("DeleteWatermark = %d, %v; want the watermark 50", prev, err)
	}
	if ws, err := f.s.Watermarks(ctx, wmGroup, ""); err != nil || len(ws) != 1 || ws[0].Partition != 1 {
		t.Fatalf("after deleting partition 0: %+v, %v; want partition 1 only", ws, err)
	}
	if _, err := f.s.DeleteWatermark(ctx, wmGroup, "payments", 0); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("DeleteWatermark of a partition without a row: %v, want store.ErrNotFound", err)
	}
	if _, err := f.s.DeleteWatermark(ctx, "", "payments", 0); !errors.Is(err, store.ErrInvalidRequest) {
		t.Fatalf("DeleteWatermark without a group: %v, want store.ErrInvalidRequest", err)
	}
	// Without the row, offset 7 runs, and the row starts again past it.
	if _, err := f.deliver(0, 7); err != nil {
		t.Fatal(err)
	}
	if e := f.event(t); e.Outcome != pipeline.OutcomeExecuted || f.ledgerRows(t) != 1 {
		t.Fatalf("offset 7 after the delete: %+v, %d ledger rows; want it executed once", e, f.ledgerRows(t))
	}
	if w := f.watermark(t, 0); w.Next != 8 {
		t.Fatalf("the row after the delete and offset 7: %+v, want the watermark 8", w)
	}
}

// Under repeatable read the second owner's claim, which waited for the
// first's transaction, fails with a serialization error (nacked by the
// stage, decided again on redelivery) instead of replaying.
func TestWatermarkTwoOwnersRepeatableRead(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	st := newStore(t, pool, postgres.Options{Schema: schema, TxOptions: pgx.TxOptions{IsoLevel: pgx.RepeatableRead}})
	wts, err := st.KafkaWatermarks("g", func(context.Context, string, int32) (int64, error) { return 1 << 62, nil })
	if err != nil {
		t.Fatal(err)
	}
	// The owners of offset 1 are other processes (their own watermarks),
	// which know nothing of the partition: they take the pessimistic claim.
	others, err := st.KafkaWatermarks("g", func(context.Context, string, int32) (int64, error) { return 1 << 62, nil })
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	claimOn := func(w store.Transactional, offset int64) (store.TxResult, error) {
		return w.ClaimInTx(ctx, store.TxRequest{Scope: "g", Key: fmt.Sprintf("t/0/%d", offset), SuccessTTL: time.Hour, Wait: 20 * time.Second})
	}
	claim := func(offset int64) (store.TxResult, error) { return claimOn(others, offset) }
	first, err := claimOn(wts, 0)
	if err != nil || first.Decision != store.DecisionExecute {
		t.Fatalf("offset 0: %v, %v", first.Decision, err)
	}
	if err := first.Tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	old, err := claim(1)
	if err != nil || old.Decision != store.DecisionExecute {
		t.Fatalf("offset 1: %v, %v", old.Decision, err)
	}
	second := make(chan error, 1)
	go func() {
		res, err := claim(1)
		if err == nil {
			err = fmt.Errorf("decision %v, want an error", res.Decision)
		}
		second <- err
	}()
	waitForLockWait(t, pool, schema)
	if err := old.Tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-second:
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "40001" {
			t.Fatalf("the second owner's claim: %v, want a serialization failure (40001)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the second owner's claim did not end")
	}
}

// A position the watermark cannot follow (offset 2^63-1, whose next offset
// overflows, or a negative partition or offset) is a message without a key:
// refused once and acked as the policy's MissingKey says, with an error that
// names the position, never run and never nacked in a loop.
func TestWatermarkOutOfRangePositionIsRefused(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{})
	for _, pos := range []struct {
		partition int32
		offset    int64
	}{{0, math.MaxInt64}, {0, -1}, {-1, 5}} {
		if _, err := f.deliver(pos.partition, pos.offset); err != nil {
			t.Fatalf("partition %d offset %d: %v; want it acked", pos.partition, pos.offset, err)
		}
		e := f.event(t)
		if e.Outcome != pipeline.OutcomeRejected || !errors.Is(e.Err, keygen.ErrNoKey) || !strings.Contains(e.Err.Error(), strconv.FormatInt(pos.offset, 10)) {
			t.Fatalf("partition %d offset %d: outcome %v, error %v; want rejected, the error naming the position", pos.partition, pos.offset, e.Outcome, e.Err)
		}
	}
	var n int
	if err := f.pool.QueryRow(t.Context(), "SELECT count(*) FROM "+f.ledger).Scan(&n); err != nil || n != 0 {
		t.Fatalf("ledger rows = %d, %v; want none: the handler never runs", n, err)
	}
}

// A topic no store can hold (a NUL byte, bytes that are not UTF-8, too
// long) is refused as that, once, with an error that names it, rather than
// hashed into a key that names no position.
func TestWatermarkUnstorableTopicIsRefused(t *testing.T) {
	t.Parallel()
	f := newWMFixture(t, policy.Policy{})
	for _, topic := range []string{"pay\x00ments", "pay\xffments", strings.Repeat("t", 1000)} {
		events := make(chan pipeline.Event, 1)
		r, err := receiver.NewTransactional(f.s).
			WithKafkaWatermark(pipeline.KafkaWatermark{
				Group: wmGroup,
				Position: func(*message.Message) (store.KafkaPosition, error) {
					return store.KafkaPosition{Topic: topic, Offset: 1}, nil
				},
				HighWaterMark: func(context.Context, string, int32) (int64, error) { return 1 << 62, nil },
			}).
			WithLogger(slog.New(slog.DiscardHandler)).
			WithEventHandler(func(e pipeline.Event) { events <- e }).
			Build()
		if err != nil {
			t.Fatal(err)
		}
		ran := false
		h := r.Middleware(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
		if _, err := h(message.NewMessage("m", nil)); err != nil || ran {
			t.Fatalf("topic %.20q: %v, handler ran %v; want it acked unrun", topic, err, ran)
		}
		if e := <-events; e.Outcome != pipeline.OutcomeRejected || !errors.Is(e.Err, keygen.ErrNoKey) || !strings.Contains(e.Err.Error(), "cannot be stored") {
			t.Fatalf("topic %.20q: outcome %v, error %v; want rejected, the error naming the topic", topic, e.Outcome, e.Err)
		}
	}
}
