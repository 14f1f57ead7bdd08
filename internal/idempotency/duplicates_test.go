package idempotency_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/postgres"
)

// deadLetters is a dead-letter publisher that keeps what it is given.
type deadLetters struct {
	mu   sync.Mutex
	msgs []*message.Message
}

func (p *deadLetters) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.msgs = append(p.msgs, msgs...)
	return nil
}

func (p *deadLetters) Close() error { return nil }

// reasons are the reason kinds of the dead letters, in order.
func (p *deadLetters) reasons() []pipeline.DeadLetterReason {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]pipeline.DeadLetterReason, len(p.msgs))
	for i, m := range p.msgs {
		out[i] = pipeline.DeadLetterReason(m.Metadata.Get(pipeline.ReasonKindKey))
	}
	return out
}

// pgTxStage is the one-transaction mode over the real PostgreSQL store in
// a schema of its own.
type pgTxStage struct {
	st     *postgres.Store
	stage  *idempotency.Transactional
	events chan pipeline.Event
}

func newPGTxStage(t *testing.T, p policy.Policy, mutate func(*idempotency.Config)) *pgTxStage {
	t.Helper()
	pool := testenv.Pool(t)
	st, err := postgres.New(pool, postgres.Options{Schema: testenv.Schema(t, pool), CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	s := &pgTxStage{st: st, events: make(chan pipeline.Event, 100)}
	cfg := idempotency.Config{KeyGenerator: keygen.UUID(), Scope: "test", Policy: p, EventHandler: func(e pipeline.Event) { s.events <- e }}
	if mutate != nil {
		mutate(&cfg)
	}
	if s.stage, err = idempotency.NewTransactional(st, cfg); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *pgTxStage) event(t *testing.T) pipeline.Event {
	t.Helper()
	select {
	case e := <-s.events:
		return e
	case <-time.After(30 * time.Second):
		t.Fatal("no event")
		return pipeline.Event{}
	}
}

// checkRejectedDuplicate fails unless e is the rejection of a duplicate of
// a key that finished with status, on attempt 1.
func checkRejectedDuplicate(t *testing.T, e pipeline.Event, status store.Status) {
	t.Helper()
	var de *pipeline.DuplicateError
	if e.Outcome != pipeline.OutcomeRejected || e.Decision != store.DecisionReplay || !errors.Is(e.Err, pipeline.ErrDuplicateRejected) || !errors.As(e.Err, &de) {
		t.Fatalf("duplicate: event %+v, want rejected with a DuplicateError wrapping ErrDuplicateRejected", e)
	}
	if de.Status != status || de.Attempt != 1 || de.Scope != "test" || de.Key != "m1" || de.LeaseLeft != 0 || de.Age < 0 || de.Age > time.Minute {
		t.Fatalf("DuplicateError %+v, want what the store holds: %v on attempt 1, written just now", de, status)
	}
}

// Under policy.FinishedKeyReject a duplicate of a success, or of a cached
// failure, is not replayed: it is acked as a rejection, dead-lettered, and
// its error says what the key holds. Both modes: the lease mode here, the
// one-transaction mode in TestTxModeFinishedKeyRejectOnPostgres.
func TestFinishedKeyRejectRejectsDuplicatesOfFinishedKeys(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		herr   error
		status store.Status
		dead   []pipeline.DeadLetterReason
	}{
		"success":        {nil, store.StatusSucceeded, []pipeline.DeadLetterReason{pipeline.DeadLetterReasonDuplicateRejected}},
		"cached failure": {policy.Cached(errDeclined), store.StatusCachedFailure, []pipeline.DeadLetterReason{pipeline.DeadLetterReasonCachedFailure, pipeline.DeadLetterReasonDuplicateRejected}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			st, err := memory.New(memory.Options{}) // the real clock, which DuplicateError.Age is read against
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			dead := &deadLetters{}
			h := newHarness(t, func(c *stageConfig) {
				c.Store = st
				c.Policy.FinishedKey = policy.FinishedKeyReject
				c.DeadLetterPublisher, c.DeadLetterTopic = dead, "dead"
			})
			var calls atomic.Int32
			handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
				calls.Add(1)
				return []*message.Message{message.NewMessage("out", nil)}, tc.herr
			})
			if _, err := handler(msg("m1", "x")); err != nil {
				t.Fatal(err)
			}
			out, err := handler(msg("m1", "x"))
			if err != nil || len(out) != 0 {
				t.Fatalf("duplicate = %v, %v; want acked, nothing re-published", out, err)
			}
			checkRejectedDuplicate(t, h.last(), tc.status)
			if calls.Load() != 1 {
				t.Fatalf("handler ran %d times, want 1", calls.Load())
			}
			if got := dead.reasons(); !slices.Equal(got, tc.dead) {
				t.Fatalf("dead letters %v, want %v", got, tc.dead)
			}
		})
	}
}

func TestTxModeFinishedKeyRejectOnPostgres(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		herr   error
		status store.Status
	}{
		"success":        {nil, store.StatusSucceeded},
		"cached failure": {policy.Cached(errDeclined), store.StatusCachedFailure},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			dead := &deadLetters{}
			p := txPolicy()
			p.FinishedKey = policy.FinishedKeyReject
			s := newPGTxStage(t, p, func(c *idempotency.Config) { c.DeadLetterPublisher, c.DeadLetterTopic = dead, "dead" })
			var calls atomic.Int32
			handler := s.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
				calls.Add(1)
				return nil, tc.herr
			})
			if _, err := handler(msg("m1", "x")); err != nil {
				t.Fatal(err)
			}
			s.event(t)
			if _, err := handler(msg("m1", "x")); err != nil {
				t.Fatalf("duplicate = %v, want acked", err)
			}
			checkRejectedDuplicate(t, s.event(t), tc.status)
			if r := dead.reasons(); calls.Load() != 1 || len(r) == 0 || r[len(r)-1] != pipeline.DeadLetterReasonDuplicateRejected {
				t.Fatalf("handler ran %d times, dead letters %v; want 1 run and the duplicate dead-lettered as rejected", calls.Load(), r)
			}
		})
	}
}

// A duplicate of a held key says what it found: the holder's status,
// attempt, age and the time left on its lease, through errors.As on
// *pipeline.DuplicateError, while errors.Is still finds the sentinel.
func TestDuplicateErrorSaysWhatItFound(t *testing.T) {
	t.Parallel()
	for _, mode := range []policy.HeldKeyMode{policy.HeldKeyNack, policy.HeldKeyWait, policy.HeldKeyReject} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			st, err := memory.New(memory.Options{}) // the real clock, which the times are read against
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			if _, err := st.ClaimLease(context.Background(), store.LeaseRequest{Scope: "test", Key: "m1", LeaseDuration: time.Hour}); err != nil {
				t.Fatal(err)
			}
			const wait = 30 * time.Millisecond
			h := newHarness(t, func(c *stageConfig) {
				c.Store = st
				c.Policy.HeldKey, c.Policy.HeldKeyTimeout = mode, wait
			})
			var calls atomic.Int32
			_, err = h.stage.Middleware(produce(&calls))(msg("m1", "x"))
			sentinel := pipeline.ErrKeyHeld
			if mode == policy.HeldKeyReject {
				sentinel = pipeline.ErrDuplicateRejected
				if err != nil {
					t.Fatalf("reject = %v, want an ack", err)
				}
				err = h.last().Err
			}
			var de *pipeline.DuplicateError
			if !errors.Is(err, sentinel) || !errors.As(err, &de) || de.Err != sentinel || calls.Load() != 0 {
				t.Fatalf("got %v (calls %d), want a DuplicateError wrapping %v", err, calls.Load(), sentinel)
			}
			if de.Scope != "test" || de.Key != "m1" || de.Status != store.StatusInProgress || de.Attempt != 1 {
				t.Fatalf("DuplicateError %+v, want the holder's record: in progress, attempt 1", de)
			}
			if de.LeaseLeft <= 59*time.Minute || de.LeaseLeft > time.Hour || de.Age < 0 || de.Age > time.Minute {
				t.Fatalf("lease left %v, age %v; want just under the holder's hour, and a record written just now", de.LeaseLeft, de.Age)
			}
			if (mode == policy.HeldKeyWait) != (de.Waited >= wait) {
				t.Fatalf("waited %v under %v, want HeldKeyTimeout %v under wait only", de.Waited, mode, wait)
			}
			if s := err.Error(); !strings.HasPrefix(s, sentinel.Error()+`: scope "test" key "m1": in_progress, attempt 1`) || !strings.Contains(s, "left") {
				t.Fatalf("error text %q says too little", s)
			}
		})
	}
}

// In the one-transaction mode the holder is an open transaction whose
// record no one else can read: the duplicate knows the key is in progress
// and how long it waited for it.
func TestTxModeDuplicateErrorOnPostgres(t *testing.T) {
	t.Parallel()
	p := txPolicy()
	p.HeldKeyTimeout = 200 * time.Millisecond
	s := newPGTxStage(t, p, nil)
	holding, release := make(chan struct{}), make(chan struct{})
	var calls atomic.Int32
	handler := s.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 {
			close(holding)
			<-release
		}
		return nil, nil
	})
	first := make(chan error, 1)
	go func() { _, err := handler(msg("m1", "x")); first <- err }()
	<-holding
	_, err := handler(msg("m1", "x"))
	close(release)
	var de *pipeline.DuplicateError
	if !errors.Is(err, pipeline.ErrKeyHeld) || !errors.As(err, &de) {
		t.Fatalf("duplicate past the bound = %v, want a DuplicateError wrapping ErrKeyHeld", err)
	}
	if de.Status != store.StatusInProgress || de.Waited < p.HeldKeyTimeout || de.LeaseLeft != 0 || de.Key != "m1" {
		t.Fatalf("DuplicateError %+v, want in progress, waited at least %v, no lease", de, p.HeldKeyTimeout)
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// Under policy.NeverCacheFailures no failure is cached: a cached-classified
// error and a retryable one past MaxAttempts both give the key back and
// nack, never dead-lettered, never dropped, until the handler succeeds.
func TestNeverCacheFailures(t *testing.T) {
	t.Parallel()
	for name, herr := range map[string]error{
		"cached":    policy.Cached(errDeclined),
		"retryable": errors.New("ledger database unreachable"),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			logs, logger := testenv.NewLogs()
			dead := &deadLetters{}
			h := newHarness(t, func(c *stageConfig) {
				c.Policy.NeverCacheFailures, c.Policy.MaxAttempts, c.Logger = true, 2, logger
				c.DeadLetterPublisher, c.DeadLetterTopic = dead, "dead"
			})
			healed := false
			handler := h.stage.Middleware(func(*message.Message) ([]*message.Message, error) {
				if healed {
					return nil, nil
				}
				return nil, herr
			})
			for i := 1; i <= 3; i++ {
				if _, err := handler(msg("m1", "x")); !errors.Is(err, herr) {
					t.Fatalf("attempt %d = %v, want the handler's error back: a nack", i, err)
				}
				if e := h.last(); e.Outcome != pipeline.OutcomeReleased || e.Attempt != i || e.Exhausted != (i >= 2) {
					t.Fatalf("attempt %d: event %+v, want released, Exhausted from attempt 2", i, e)
				}
				if rec, err := h.store.Get(context.Background(), "test", "m1"); err != nil || rec.Status != store.StatusRetryable || rec.Attempt != i {
					t.Fatalf("attempt %d: record %+v, %v; want the key given back, nothing cached", i, rec, err)
				}
			}
			if r := dead.reasons(); len(r) != 0 {
				t.Fatalf("dead letters %v, want none", r)
			}
			if errs := logs.At(slog.LevelError); len(errs) != 2 || !strings.Contains(errs[0].Msg, "NeverCacheFailures") {
				t.Fatalf("error lines %+v, want one per failure from attempt MaxAttempts (2)", errs)
			}
			healed = true
			if _, err := handler(msg("m1", "x")); err != nil || h.last().Outcome != pipeline.OutcomeExecuted {
				t.Fatalf("healed: %v, event %+v; want executed", err, h.last())
			}
		})
	}
}

func TestTxModeNeverCacheFailuresOnPostgres(t *testing.T) {
	t.Parallel()
	dead := &deadLetters{}
	p := txPolicy()
	p.NeverCacheFailures, p.MaxAttempts = true, 2
	s := newPGTxStage(t, p, func(c *idempotency.Config) { c.DeadLetterPublisher, c.DeadLetterTopic = dead, "dead" })
	handler := s.stage.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, policy.Cached(errDeclined) })
	for i := 1; i <= 3; i++ {
		if _, err := handler(msg("m1", "x")); !errors.Is(err, errDeclined) {
			t.Fatalf("attempt %d = %v, want the handler's error back: a nack", i, err)
		}
		if e := s.event(t); e.Outcome != pipeline.OutcomeReleased || e.Attempt != i || e.Exhausted != (i >= 2) {
			t.Fatalf("attempt %d: event %+v, want released, Exhausted from attempt 2", i, e)
		}
		if rec, err := s.st.Get(context.Background(), "test", "m1"); err != nil || rec.Status != store.StatusRetryable || rec.Attempt != i {
			t.Fatalf("attempt %d: record %+v, %v; want the key given back, nothing cached", i, rec, err)
		}
	}
	if r := dead.reasons(); len(r) != 0 {
		t.Fatalf("dead letters %v, want none", r)
	}
}
