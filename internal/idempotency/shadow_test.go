package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// shadowStage is either mode's stage in shadow mode, over a store whose
// records a test reads and whose keys it can hold (hold: a claim of its
// own that never ends), recording events and metrics.
type shadowStage struct {
	middleware func(message.HandlerFunc) message.HandlerFunc
	records    interface {
		Get(ctx context.Context, scope, key string) (store.Record, error)
	}
	hold   func(key string)
	failed *atomic.Bool // makes every claim fail as a store outage does
	tel    *telKit
	logs   *testenv.Logs

	mu     sync.Mutex
	events []pipeline.Event
}

func (s *shadowStage) last(t *testing.T) pipeline.Event {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.events) == 0 {
		t.Fatal("no event recorded")
	}
	return s.events[len(s.events)-1]
}

// outageStore fails every claim while failed is set.
type outageStore struct {
	store.Store
	failed *atomic.Bool
}

func (o outageStore) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	if o.failed.Load() {
		return store.ClaimResult{}, errStoreDown
	}
	return o.Store.ClaimLease(ctx, req)
}

type outageTxStore struct {
	*fakeTxStore
	failed *atomic.Bool
}

func (o outageTxStore) ClaimInTx(ctx context.Context, req store.TxRequest) (store.TxResult, error) {
	if o.failed.Load() {
		return store.TxResult{}, errStoreDown
	}
	return o.fakeTxStore.ClaimInTx(ctx, req)
}

// newShadowStage builds the stage of mode ("leased" or "transactional")
// with Config.Shadow set, a policy that waits an hour for a held key (shadow
// mode must not wait at all), and p's HeldKey.
func newShadowStage(t *testing.T, mode string, held policy.HeldKeyMode, mutate ...func(*idempotency.Config)) *shadowStage {
	t.Helper()
	s := &shadowStage{tel: newTelKit(t), failed: new(atomic.Bool)}
	logs, logger := testenv.NewLogs()
	s.logs = logs
	cfg := idempotency.Config{
		KeyGenerator: keygen.UUID(),
		Scope:        "s",
		Shadow:       true,
		Logger:       logger, // shadowed duplicates are logged at debug level, with what enforcement would have done
		EventHandler: func(e pipeline.Event) {
			s.mu.Lock()
			s.events = append(s.events, e)
			s.mu.Unlock()
		},
	}
	s.tel.use(&cfg)
	hold := func(st store.Store) func(string) {
		return func(key string) {
			if _, err := st.ClaimLease(context.Background(), store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: time.Hour}); err != nil {
				t.Fatal(err)
			}
		}
	}
	switch mode {
	case "leased":
		h := newHarness(t, nil)
		s.records, s.hold = h.store, hold(h.store)
		cfg.Policy = policy.Policy{}.WithDefaults()
		cfg.Policy.NackDelay, cfg.Policy.AttemptDelay = -1, -1
		cfg.Policy.HeldKey, cfg.Policy.HeldKeyTimeout = held, time.Hour
		for _, m := range mutate {
			m(&cfg)
		}
		stage, err := idempotency.NewLeased(outageStore{Store: h.store, failed: s.failed}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.middleware = stage.Middleware
	case "transactional":
		st := newFakeTxStore()
		t.Cleanup(func() { _ = st.Close() })
		s.records, s.hold = st, hold(st)
		cfg.Policy = txPolicy()
		cfg.Policy.HeldKey, cfg.Policy.HeldKeyTimeout = held, time.Hour
		for _, m := range mutate {
			m(&cfg)
		}
		stage, err := idempotency.NewTransactional(outageTxStore{fakeTxStore: st, failed: s.failed}, cfg)
		if err != nil {
			t.Fatal(err)
		}
		s.middleware = stage.Middleware
	}
	return s
}

// shadowHandler counts its runs, notes whether any ran inside a claim or a
// transaction of oncemill's, produces one message named after its run and
// returns the error of fail (nil: success).
type shadowHandler struct {
	runs, guarded atomic.Int32
	fail          atomic.Pointer[error]
}

func (h *shadowHandler) handle(m *message.Message) ([]*message.Message, error) {
	n := h.runs.Add(1)
	_, claimed := pipeline.ClaimFromContext(m.Context())
	if claimed || m.Context().Value(fakeTxKey{}) != nil {
		h.guarded.Add(1)
	}
	if err := h.fail.Load(); err != nil {
		return nil, *err
	}
	return []*message.Message{message.NewMessage("run-"+string(rune('0'+n)), nil)}, nil
}

// In shadow mode, every delivery the stage would have answered without the
// handler (a replay of a success or of a cached failure, a held key under
// each policy.HeldKeyMode, a mismatch) runs the handler, unguarded and at
// once, and returns its result; the event reports what enforcement would
// have done, oncemill.shadow.duplicates counts it by decision, and the
// records stay as the executions left them.
func TestShadowRunsTheHandlerForEveryDuplicate(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"leased", "transactional"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newShadowStage(t, mode, policy.HeldKeyWait)
			var h shadowHandler
			handler := s.middleware(h.handle)
			ctx := context.Background()

			// Executions: recorded as without shadow mode, in a claim.
			if _, err := handler(msg("ok", "a")); err != nil {
				t.Fatal(err)
			}
			declined := error(policy.Cached(errDeclined))
			h.fail.Store(&declined)
			if _, err := handler(msg("declined", "a")); !errors.Is(err, errDeclined) {
				t.Fatalf("a cached failure: got %v, want the handler's error, as without oncemill", err)
			}
			h.fail.Store(nil)
			if e := s.last(t); e.Outcome != pipeline.OutcomeCachedFailure || !e.Shadow {
				t.Fatalf("execution's event %+v, want a cached failure, shadowed: enforcement would have acked it", e)
			}
			if h.runs.Load() != 2 || h.guarded.Load() != 2 {
				t.Fatalf("executions: %d runs, %d in a claim; want 2 and 2", h.runs.Load(), h.guarded.Load())
			}
			okRec, err := s.records.Get(ctx, "s", "ok")
			if err != nil {
				t.Fatal(err)
			}
			s.hold("held")

			for _, tc := range []struct {
				m        *message.Message
				outcome  pipeline.Outcome
				decision store.Decision
			}{
				{msg("ok", "a"), pipeline.OutcomeReplayed, store.DecisionReplay},
				{msg("declined", "a"), pipeline.OutcomeCachedFailureReplayed, store.DecisionReplay},
				{msg("held", "a"), pipeline.OutcomeHeldKeyNacked, store.DecisionHeld},
				{msg("ok", "changed"), pipeline.OutcomeRejected, store.DecisionMismatch},
			} {
				before := h.runs.Load()
				out, err := handler(tc.m)
				if err != nil || len(out) != 1 || out[0].UUID != "run-"+string(rune('0'+before+1)) {
					t.Fatalf("%s: got (%v, %v), want the handler's own run's message and an ack", tc.outcome, out, err)
				}
				e := s.last(t)
				if !e.Shadow || e.Outcome != tc.outcome || e.Decision != tc.decision || e.Err != nil {
					t.Errorf("%s: event %+v, want Shadow with outcome %s and decision %s", tc.m.UUID, e, tc.outcome, tc.decision)
				}
			}
			if h.runs.Load() != 6 || h.guarded.Load() != 2 {
				t.Fatalf("%d runs, %d in a claim; want 6 runs, the 4 duplicates unguarded", h.runs.Load(), h.guarded.Load())
			}
			if rec, err := s.records.Get(ctx, "s", "ok"); err != nil || rec.Token != okRec.Token || rec.Status != store.StatusSucceeded || !rec.UpdatedAt.Equal(okRec.UpdatedAt) {
				t.Fatalf("record of ok after its shadowed duplicates: %+v, %v; want it unchanged: %+v", rec, err, okRec)
			}
			if rec, err := s.records.Get(ctx, "s", "declined"); err != nil || rec.Status != store.StatusCachedFailure {
				t.Fatalf("record of declined after a shadowed duplicate succeeded: %+v, %v; want the cached failure", rec, err)
			}
			ms := s.tel.collect(t)
			if m := ms["oncemill.shadow.duplicates"]; m.Unit != "{delivery}" || m.Description == "" {
				t.Errorf("oncemill.shadow.duplicates: unit %q, description %q; want {delivery} and a description", m.Unit, m.Description)
			}
			if sum, ok := ms["oncemill.shadow.duplicates"].Data.(metricdata.Sum[int64]); !ok || !sum.IsMonotonic {
				t.Errorf("oncemill.shadow.duplicates is a %T, want an Int64Counter", ms["oncemill.shadow.duplicates"].Data)
			}
			if got, want := teltest.Sums(t, ms, "oncemill.shadow.duplicates", "decision"), map[string]int64{
				"replay": 1, "cached_failure": 1, "held": 1, "mismatch": 1,
			}; !maps.Equal(got, want) {
				t.Errorf("shadow.duplicates %v, want %v", got, want)
			}
			if got, want := teltest.Sums(t, ms, "oncemill.outcomes", "outcome"), map[string]int64{
				"executed": 1, "cached_failure": 1, "replayed": 1, "cached_failure_replayed": 1, "held_key_nacked": 1, "rejected": 1,
			}; !maps.Equal(got, want) {
				t.Errorf("outcomes %v, want %v (what enforcement would have done)", got, want)
			}
			// The replay age is measured as under enforcement: it tells a
			// redelivery from a key that is too wide.
			if got := teltest.HistCounts(t, ms, "oncemill.replay.age", "original"); !maps.Equal(got, map[string]uint64{"succeeded": 1, "cached_failure": 1}) {
				t.Errorf("replay.age counts %v, want one of each", got)
			}
			// A mismatch, the finding to fix before enforcing, is a warning
			// line; the other duplicates' lines are at debug level.
			if warns := s.logs.At(slog.LevelWarn); len(warns) != 1 || warns[0].Attrs["would"] != "rejected" || warns[0].Attrs["decision"] != "mismatch" {
				t.Errorf("warning lines %+v, want one for the mismatch", warns)
			}
			var would []string
			for _, l := range s.logs.At(slog.LevelDebug) {
				if w, ok := l.Attrs["would"]; ok {
					would = append(would, fmt.Sprint(w))
				}
			}
			if want := []string{"replayed", "cached_failure_replayed", "held_key_nacked"}; !slices.Equal(would, want) {
				t.Errorf("debug lines say would %v, want %v", would, want)
			}
			shadowSpans := 0
			for _, sp := range s.tel.deliveries() {
				if v, ok := teltest.SpanAttrs(sp)["idempotency.shadow"]; ok && v.AsBool() {
					shadowSpans++
				}
			}
			if shadowSpans != 5 {
				t.Errorf("%d delivery spans with idempotency.shadow, want the cached failure's and the 4 duplicates'", shadowSpans)
			}
		})
	}
}

// Under policy.HeldKeyReject and HeldKeyNack, a held key's delivery in
// shadow mode runs at once too, and reports the answer of that policy.
func TestShadowHeldKeyReportsThePolicysAnswer(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"leased", "transactional"} {
		for held, want := range map[policy.HeldKeyMode]pipeline.Outcome{
			policy.HeldKeyNack:   pipeline.OutcomeHeldKeyNacked,
			policy.HeldKeyReject: pipeline.OutcomeRejected,
		} {
			t.Run(mode+"/"+held.String(), func(t *testing.T) {
				t.Parallel()
				s := newShadowStage(t, mode, held)
				var h shadowHandler
				s.hold("k")
				if _, err := s.middleware(h.handle)(msg("k", "a")); err != nil || h.runs.Load() != 1 {
					t.Fatalf("got %v after %d runs, want an ack after 1", err, h.runs.Load())
				}
				if e := s.last(t); !e.Shadow || e.Outcome != want || !e.Contended || e.Decision != store.DecisionHeld {
					t.Fatalf("event %+v, want Shadow, %s, contended", e, want)
				}
				if got := teltest.Sums(t, s.tel.collect(t), "oncemill.shadow.duplicates", "decision"); !maps.Equal(got, map[string]int64{"held": 1}) {
					t.Fatalf("shadow.duplicates %v, want held 1", got)
				}
			})
		}
	}
}

// A store that cannot decide does not hold up the consumer in shadow mode:
// the handler runs unguarded, and the event says the store failed. It is
// not a duplicate, so oncemill.shadow.duplicates does not count it.
func TestShadowRunsTheHandlerWhenTheStoreFails(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"leased", "transactional"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newShadowStage(t, mode, policy.HeldKeyWait)
			s.failed.Store(true)
			var h shadowHandler
			out, err := s.middleware(h.handle)(msg("m1", "a"))
			if err != nil || len(out) != 1 || h.runs.Load() != 1 || h.guarded.Load() != 0 {
				t.Fatalf("got (%v, %v) after %d runs (%d guarded), want the unguarded run's message and an ack", out, err, h.runs.Load(), h.guarded.Load())
			}
			if e := s.last(t); !e.Shadow || e.Outcome != pipeline.OutcomeStoreFailed {
				t.Fatalf("event %+v, want Shadow with outcome store_failed", e)
			}
			ms := s.tel.collect(t)
			if got := teltest.Sums(t, ms, "oncemill.shadow.duplicates", "decision"); len(got) != 0 {
				t.Errorf("shadow.duplicates %v, want none", got)
			}
			if got := teltest.Sums(t, ms, "oncemill.outcomes", "outcome"); !maps.Equal(got, map[string]int64{"store_failed": 1}) {
				t.Errorf("outcomes %v, want store_failed 1", got)
			}
		})
	}
}

// A shadowed duplicate's failure, permanent or retryable, is the handler's
// error to the router, as without oncemill, and changes no record.
// Event.Err carries it.
func TestShadowReturnsTheHandlersFailure(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"leased", "transactional"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newShadowStage(t, mode, policy.HeldKeyWait)
			var h shadowHandler
			handler := s.middleware(h.handle)
			if _, err := handler(msg("m1", "a")); err != nil {
				t.Fatal(err)
			}
			declined, down := error(policy.Cached(errDeclined)), errors.New("try later")
			h.fail.Store(&declined)
			if _, err := handler(msg("m1", "a")); !errors.Is(err, errDeclined) {
				t.Fatalf("a permanent failure of a shadowed duplicate: %v, want a nack with it", err)
			}
			if e := s.last(t); !e.Shadow || e.Outcome != pipeline.OutcomeReplayed || !errors.Is(e.Err, errDeclined) {
				t.Fatalf("event %+v", e)
			}
			h.fail.Store(&down)
			if _, err := handler(msg("m1", "a")); !errors.Is(err, down) {
				t.Fatalf("a retryable failure of a shadowed duplicate: %v, want a nack with it", err)
			}
			if e := s.last(t); !e.Shadow || !errors.Is(e.Err, down) {
				t.Fatalf("event %+v", e)
			}
			if rec, err := s.records.Get(context.Background(), "s", "m1"); err != nil || rec.Status != store.StatusSucceeded {
				t.Fatalf("record %+v, %v; want the first run's success", rec, err)
			}
			if h.runs.Load() != 3 {
				t.Fatalf("%d runs, want 3", h.runs.Load())
			}
		})
	}
}

// A message without a usable key, which enforcement would reject (no key,
// a key generator's permanent error, a payload over MaxPayloadBytes) or
// nack until the generator recovers, runs the handler unguarded in shadow
// mode: the trial neither loses it nor holds up the consumer. It is not a
// duplicate, so oncemill.shadow.duplicates does not count it.
func TestShadowRunsTheHandlerWithoutAKey(t *testing.T) {
	t.Parallel()
	lookupDown := errors.New("lookup service down")
	for _, mode := range []string{"leased", "transactional"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newShadowStage(t, mode, policy.HeldKeyWait, func(c *idempotency.Config) {
				c.Policy.MaxPayloadBytes = 8
				c.KeyGenerator = keygen.Func(func(m *message.Message) (string, error) {
					switch string(m.Payload) {
					case "down":
						return "", lookupDown
					case "refused":
						return "", policy.Cached(errDeclined)
					}
					return keygen.UUID().Key(m)
				})
			})
			var h shadowHandler
			handler := s.middleware(h.handle)
			for _, tc := range []struct {
				m    *message.Message
				want pipeline.Outcome
			}{
				{msg("", "x"), pipeline.OutcomeRejected},
				{msg("m1", "too large"), pipeline.OutcomeRejected},
				{msg("m2", "down"), pipeline.OutcomeKeyFailed},
				{msg("m3", "refused"), pipeline.OutcomeRejected},
			} {
				runs := h.runs.Load()
				out, err := handler(tc.m)
				if err != nil || len(out) != 1 || h.runs.Load() != runs+1 {
					t.Fatalf("%q: got (%v, %v) after %d runs, want the handler's message and an ack", tc.m.Payload, out, err, h.runs.Load()-runs)
				}
				if e := s.last(t); !e.Shadow || e.Outcome != tc.want || e.Decision != 0 {
					t.Errorf("%q: event %+v, want Shadow with outcome %s and no decision", tc.m.Payload, e, tc.want)
				}
			}
			if h.guarded.Load() != 0 {
				t.Errorf("%d runs in a claim, want none", h.guarded.Load())
			}
			if got := teltest.Sums(t, s.tel.collect(t), "oncemill.shadow.duplicates", "decision"); len(got) != 0 {
				t.Errorf("shadow.duplicates %v, want none", got)
			}
			if errs := s.logs.At(slog.LevelError); len(errs) != 4 {
				t.Errorf("%d error lines, want one per message without a usable key", len(errs))
			}
		})
	}
}

// Under policy.FinishedKeyReject a duplicate of a finished key would be
// rejected: shadow mode runs it, and says so.
func TestShadowFinishedKeyRejectReportsARejection(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"leased", "transactional"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			s := newShadowStage(t, mode, policy.HeldKeyWait, func(c *idempotency.Config) { c.Policy.FinishedKey = policy.FinishedKeyReject })
			var h shadowHandler
			handler := s.middleware(h.handle)
			for range 2 {
				if _, err := handler(msg("done", "a")); err != nil {
					t.Fatal(err)
				}
			}
			if e := s.last(t); !e.Shadow || e.Outcome != pipeline.OutcomeRejected || e.Decision != store.DecisionReplay || h.runs.Load() != 2 {
				t.Fatalf("event %+v after %d runs, want a shadowed rejection of a replay and 2 runs", e, h.runs.Load())
			}
			if got := teltest.Sums(t, s.tel.collect(t), "oncemill.shadow.duplicates", "decision"); !maps.Equal(got, map[string]int64{"replay": 1}) {
				t.Fatalf("shadow.duplicates %v, want replay 1", got)
			}
		})
	}
}
