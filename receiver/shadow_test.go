package receiver_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/postgres"
)

// WithShadow(true) runs the handler for a duplicate and counts it as
// oncemill_shadow_duplicates_total{decision} in Prometheus (the name
// docs/operations.md's PromQL uses); WithShadow(false) over the same store
// enforces again: the duplicate is replayed without running.
func TestWithShadow(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	st := telStore(t)
	var runs atomic.Int32
	handler := func(*message.Message) ([]*message.Message, error) { runs.Add(1); return nil, nil }

	shadow, err := receiver.New(st).WithScope("orders").WithMeterProvider(mp).WithShadow(true).Build()
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if _, err := shadow.Middleware(handler)(message.NewMessage("o1", []byte("x"))); err != nil {
			t.Fatal(err)
		}
	}
	if runs.Load() != 3 {
		t.Fatalf("shadow: %d runs for 3 deliveries of one message, want 3", runs.Load())
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var counted float64
	for _, f := range families {
		if f.GetName() != "oncemill_shadow_duplicates_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "decision" && l.GetValue() == "replay" {
					counted += m.GetCounter().GetValue()
				}
			}
		}
	}
	if counted != 2 {
		t.Fatalf("oncemill_shadow_duplicates_total{decision=\"replay\"} = %v, want 2", counted)
	}

	enforcing, err := receiver.New(st).WithScope("orders").WithShadow(true).WithShadow(false).Build()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enforcing.Middleware(handler)(message.NewMessage("o1", []byte("x"))); err != nil || runs.Load() != 3 {
		t.Fatalf("enforcing: %v after %d runs, want the duplicate replayed without a run", err, runs.Load())
	}
}

// dropsNothingCase is one message of TestShadowDropsNothing: the handler
// fails its first fails deliveries with err, then succeeds.
type dropsNothingCase struct {
	name, uuid, payload string
	fails               int32
	err                 error
	// outcomes are the events' outcomes, one per delivery: what
	// enforcement would have done, counted as such.
	outcomes []pipeline.Outcome
}

// ackLog is, per case, the router's answer to each delivery: ack or nack.
type ackLog struct {
	mu      sync.Mutex
	answers map[string][]string
}

func (l *ackLog) add(name, answer string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answers[name] = append(l.answers[name], answer)
}

func (l *ackLog) get(name string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.answers[name])
}

// runDropsNothing sends the cases one after the other through a gochannel
// router whose handler is wrapped in mw (nil: the bare handler), each once
// its predecessor was acked, holding the key "held" first, and returns
// what the router answered to every delivery.
func runDropsNothing(t *testing.T, cases []dropsNothingCase, mw message.HandlerMiddleware, hold func(key string)) *ackLog {
	t.Helper()
	logger := watermill.NopLogger{}
	pubSub := gochannel.NewGoChannel(gochannel.Config{}, logger)
	router, err := message.NewRouter(message.RouterConfig{}, logger)
	if err != nil {
		t.Fatal(err)
	}
	log := &ackLog{answers: map[string][]string{}}
	router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc { // outermost: what the router is told
		return func(m *message.Message) ([]*message.Message, error) {
			out, err := h(m)
			log.add(m.Metadata.Get("case"), map[bool]string{true: "ack", false: "nack"}[err == nil])
			return out, err
		}
	})
	if mw != nil {
		router.AddMiddleware(mw)
	}
	runs, byName := map[string]*atomic.Int32{}, map[string]dropsNothingCase{}
	for _, c := range cases {
		runs[c.name], byName[c.name] = new(atomic.Int32), c
	}
	router.AddConsumerHandler("orders", "orders", pubSub, func(m *message.Message) error {
		c := byName[m.Metadata.Get("case")]
		if runs[c.name].Add(1) <= c.fails {
			return c.err
		}
		return nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = router.Run(ctx); close(done) }()
	defer func() { cancel(); <-done; _ = pubSub.Close() }()
	<-router.Running()
	if hold != nil {
		hold("held")
	}
	for _, c := range cases {
		m := message.NewMessage(c.uuid, []byte(c.payload))
		m.Metadata.Set("case", c.name)
		if err := pubSub.Publish("orders", m); err != nil {
			t.Fatal(err)
		}
		testenv.WaitFor(t, 30*time.Second, c.name+" to be acked", func() bool { return slices.Contains(log.get(c.name), "ack") })
	}
	return log
}

// In shadow mode the router acks exactly what it acks for the bare
// handler, and nacks what it nacks, in both modes, whatever enforcement
// would have done: drop the last attempt (policy.ExhaustedDrop), ack a
// cached failure, reject a mismatch, nack a held key; the events and the
// metrics count what enforcement would have done.
func TestShadowDropsNothing(t *testing.T) {
	t.Parallel()
	down, declined := errors.New("database down"), errors.New("card declined")
	cases := []dropsNothingCase{
		// Attempt 1 is given back; attempt 2, the last, would be dropped
		// (recorded as a cached failure); its redeliveries are replays.
		{"drop", "o-drop", "x", 3, down, []pipeline.Outcome{pipeline.OutcomeReleased, pipeline.OutcomeCachedFailure, pipeline.OutcomeCachedFailureReplayed, pipeline.OutcomeCachedFailureReplayed}},
		{"cached error", "o-declined", "x", 1, declined, []pipeline.Outcome{pipeline.OutcomeCachedFailure, pipeline.OutcomeCachedFailureReplayed}},
		{"original", "o-changed", "x", 0, nil, []pipeline.Outcome{pipeline.OutcomeExecuted}},
		{"mismatch", "o-changed", "y", 1, declined, []pipeline.Outcome{pipeline.OutcomeRejected, pipeline.OutcomeRejected}},
		{"held key", "held", "x", 1, down, []pipeline.Outcome{pipeline.OutcomeHeldKeyNacked, pipeline.OutcomeHeldKeyNacked}},
	}
	bare := runDropsNothing(t, cases, nil, nil)
	p := policy.Policy{
		MaxAttempts: 2, Exhausted: policy.ExhaustedDrop, HeldKey: policy.HeldKeyNack,
		CachedErrors: []error{declined}, NackDelay: -1, AttemptDelay: -1,
	}
	var deadLetters countingPublisher
	memoryStore := func(t *testing.T) *memory.Store {
		st, err := memory.New(memory.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = st.Close() })
		return st
	}
	for mode, build := range map[string]func(t *testing.T) (*receiver.Builder, func(string)){
		"lease mode, memory": func(t *testing.T) (*receiver.Builder, func(string)) {
			st := memoryStore(t)
			return receiver.New(st), holdKey(t, st)
		},
		// A dead letter would take the exhausted message: none is published.
		"lease mode, memory, dead letter": func(t *testing.T) (*receiver.Builder, func(string)) {
			st := memoryStore(t)
			return receiver.New(st).WithDeadLetter(&deadLetters, "orders.dead"), holdKey(t, st)
		},
		"one-transaction mode, postgres": func(t *testing.T) (*receiver.Builder, func(string)) {
			pool := testenv.Pool(t)
			st, err := postgres.New(pool, postgres.Options{Schema: testenv.Schema(t, pool), CleanupInterval: -1})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			if err := st.Migrate(context.Background()); err != nil {
				t.Fatal(err)
			}
			return receiver.NewTransactional(st), holdKey(t, st)
		},
	} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			b, hold := build(t)
			sdk := teltest.New(t)
			logs, logger := testenv.NewLogs()
			var mu sync.Mutex
			events := map[string][]pipeline.Event{}
			r, err := b.WithScope("orders").WithPolicy(p).WithShadow(true).WithMeterProvider(sdk.MeterProvider).WithLogger(logger).
				WithEventHandler(func(e pipeline.Event) {
					mu.Lock()
					events[e.MessageUUID] = append(events[e.MessageUUID], e)
					mu.Unlock()
				}).Build()
			if err != nil {
				t.Fatal(err)
			}
			shadow := runDropsNothing(t, cases, r.Middleware, hold)
			mu.Lock()
			defer mu.Unlock()
			for _, c := range cases {
				want := slices.Repeat([]string{"nack"}, int(c.fails))
				if got := bare.get(c.name); !slices.Equal(got, append(want, "ack")) {
					t.Fatalf("%s: the bare handler's answers %v, want %d nacks and an ack", c.name, got, c.fails)
				}
				if got := shadow.get(c.name); !slices.Equal(got, bare.get(c.name)) {
					t.Errorf("%s: shadow mode answered %v, the bare handler %v", c.name, got, bare.get(c.name))
				}
			}
			for _, uuid := range []string{"o-drop", "o-declined", "o-changed", "held"} {
				var want []pipeline.Outcome
				for _, c := range cases {
					if c.uuid == uuid {
						want = append(want, c.outcomes...)
					}
				}
				var got []pipeline.Outcome
				for _, e := range events[uuid] {
					got = append(got, e.Outcome)
					// Shadow: the router was told otherwise than Outcome says.
					if e.Shadow == (e.Outcome == pipeline.OutcomeExecuted || e.Outcome == pipeline.OutcomeReleased) {
						t.Errorf("%s: event %+v, Shadow should be %v", uuid, e, !e.Shadow)
					}
				}
				if !slices.Equal(got, want) {
					t.Errorf("%s: outcomes %v, want %v (what enforcement would have done)", uuid, got, want)
				}
			}
			ms := sdk.Metrics(t)
			// The two failures enforcement would have acked are logged as such.
			var would []string
			for _, l := range logs.At(slog.LevelError) {
				if strings.HasPrefix(l.Msg, "Shadow mode: the handler failed") {
					would = append(would, fmt.Sprint(l.Attrs["message_uuid"], ": ", l.Msg))
				}
			}
			wouldDrop := "o-drop: Shadow mode: the handler failed; the message is nacked, where enforcement would drop: ack without a dead letter (policy.ExhaustedDrop)"
			wouldCache := "o-declined: Shadow mode: the handler failed; the message is nacked, where enforcement would cache the failure and ack"
			want := map[string]int64{"dropped": 1}
			if strings.HasSuffix(mode, "dead letter") {
				wouldDrop = "o-drop: Shadow mode: the handler failed; the message is nacked, where enforcement would dead-letter and ack"
				wouldCache = "o-declined: Shadow mode: the handler failed; the message is nacked, where enforcement would dead-letter and ack"
				want = map[string]int64{"dead_lettered": 1}
				if n := deadLetters.published.Load(); n != 0 {
					t.Errorf("%d dead letters published, want none", n)
				}
			}
			if !slices.Equal(would, []string{wouldDrop, wouldCache}) {
				t.Errorf("error lines %q, want %q and %q", would, wouldDrop, wouldCache)
			}
			if got := teltest.Sums(t, ms, "oncemill.attempts.exhausted", "action"); !maps.Equal(got, want) {
				t.Errorf("attempts.exhausted %v, want %v", got, want)
			}
			if got, want := teltest.Sums(t, ms, "oncemill.shadow.duplicates", "decision"), map[string]int64{"cached_failure": 3, "mismatch": 2, "held": 2}; !maps.Equal(got, want) {
				t.Errorf("shadow.duplicates %v, want %v", got, want)
			}
		})
	}
}

// holdKey returns a function that holds a key with a lease of an hour.
func holdKey(t *testing.T, st store.Store) func(string) {
	return func(key string) {
		if _, err := st.ClaimLease(context.Background(), store.LeaseRequest{Scope: "orders", Key: key, LeaseDuration: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
}

// countingPublisher counts what is published to it.
type countingPublisher struct{ published atomic.Int32 }

func (p *countingPublisher) Publish(string, ...*message.Message) error {
	p.published.Add(1)
	return nil
}

func (p *countingPublisher) Close() error { return nil }
