package deploy

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/sony/gobreaker/v2"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/mysql"
	"github.com/oncemill/oncemill/store/postgres"
)

// scrapeLabels are the labels Prometheus itself adds to every scraped
// series; the rules group by them.
var scrapeLabels = []string{"job", "instance"}

// exported maps each series name a scrape of the exporter yields
// (counters with _total, histograms as _bucket, _sum and _count) to its
// label names and the values seen for each.
type exported map[string]map[string]map[string]bool

// exportedSeries runs a receiver over the PostgreSQL store, exporting
// through the real OpenTelemetry Prometheus exporter, drives a delivery
// into every decision and failure path the dashboard and rules name, and
// returns what the exporter exposes. A MySQL store exports beside it: the
// store metrics are the same series for both.
func exportedSeries(t *testing.T) exported {
	t.Helper()
	ctx := t.Context()
	reg := prometheus.NewRegistry()
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })

	pool := testenv.Pool(t)
	st, err := postgres.New(pool, postgres.Options{Schema: testenv.Schema(t, pool), MeterProvider: mp, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	dead := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	t.Cleanup(func() { _ = dead.Close() })
	dl, err := dead.Subscribe(ctx, "dead")
	if err != nil {
		t.Fatal(err)
	}
	var deadLetters atomic.Int32
	go func() {
		for m := range dl {
			deadLetters.Add(1)
			m.Ack()
		}
	}()

	retry := pipeline.RetryConfig{MaxTries: 2}
	retry.InitialInterval, retry.MaxInterval, retry.RandomizationFactor = time.Millisecond, time.Millisecond, -1
	r, err := receiver.New(st).
		WithMeterProvider(mp).
		WithLogger(slog.New(slog.DiscardHandler)).
		WithScope("payments"). // the same scope for the router's deliveries and the direct call below
		WithRetry(retry).
		WithCircuitBreaker(gobreaker.Settings{
			Name:        "payments-db",
			Timeout:     time.Minute, // stays open until the metrics are gathered
			ReadyToTrip: func(c gobreaker.Counts) bool { return c.ConsecutiveFailures >= 2 },
		}).
		WithDeadLetter(dead, "dead").
		WithPolicy(policy.Policy{MaxAttempts: 1, HeldKey: policy.HeldKeyNack, NackDelay: -1}).
		Build()
	if err != nil {
		t.Fatal(err)
	}

	entered, release := make(chan struct{}), make(chan struct{})
	handler := func(m *message.Message) ([]*message.Message, error) {
		switch string(m.Payload) {
		case "slow":
			close(entered)
			select {
			case <-release:
			case <-time.After(30 * time.Second):
				return nil, errors.New("not released within 30s")
			}
		case "refused":
			return nil, policy.Cached(errors.New("amount missing"))
		case "flaky":
			return nil, errors.New("database briefly unavailable")
		}
		return nil, nil
	}
	rt := startRouter(t, r, "payments", handler)

	ok := message.NewMessage("k1", []byte("ok"))
	refused := message.NewMessage("k2", []byte("refused"))
	rt.deliver(ok)      // execute
	rt.deliver(ok)      // replay
	rt.deliver(refused) // execute; the failure is cached and dead-lettered
	rt.deliver(refused) // cached_failure

	// held: a duplicate arrives while the first delivery's handler runs.
	slow := message.NewMessage("k3", []byte("slow"))
	done := rt.publish(slow)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the slow handler did not start within 10s")
	}
	if _, err := r.Middleware(handler)(message.NewMessage("k3", []byte("slow"))); err == nil {
		t.Fatal("a duplicate of a held key was acked; want a nack (policy.HeldKeyNack)")
	}
	close(release)
	rt.wait(done, slow)

	// Two failed tries open the breaker; the one attempt is exhausted and
	// the message dead-lettered.
	rt.deliver(message.NewMessage("k4", []byte("flaky")))
	testenv.WaitFor(t, 10*time.Second, "two dead letters", func() bool { return deadLetters.Load() == 2 })

	// A store that fails: its begin is counted in oncemill.store.errors.
	closed, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	failing, err := receiver.New(closed).WithMeterProvider(mp).WithLogger(slog.New(slog.DiscardHandler)).Build()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := failing.Middleware(handler)(message.NewMessage("k5", []byte("ok"))); err == nil {
		t.Fatal("a delivery over a closed store was acked; want a nack")
	}

	// The cleaner's counter; the lag gauge is read at every scrape.
	if _, err := st.DeleteExpired(ctx, 100); err != nil {
		t.Fatal(err)
	}
	my, err := mysql.New(testenv.MariaDB(t, testenv.MariaDBDatabase(t)), mysql.Options{MeterProvider: mp, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { my.Close() })
	if err := my.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := my.DeleteExpired(ctx, 100); err != nil {
		t.Fatal(err)
	}

	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() == "oncemill_breaker_state" {
			if ms := f.GetMetric(); len(ms) != 1 || ms[0].GetGauge().GetValue() != 2 {
				t.Fatalf("oncemill_breaker_state = %v, want one series at 2 (open) after two failed tries", ms)
			}
		}
	}
	series := seriesOf(families)
	for _, name := range []string{"oncemill_store_cleanup_lag_seconds", "oncemill_store_cleanup_deleted_total"} {
		if tables := series[name]["oncemill_store_table"]; len(tables) != 2 || !tables["oncemill_records"] {
			t.Fatalf("%s has the tables %v, want the PostgreSQL store's and the MySQL store's (oncemill_records)", name, keys(tables))
		}
	}
	return series
}

// seriesOf lists the series a scrape of families yields, as Prometheus
// stores them.
func seriesOf(families []*dto.MetricFamily) exported {
	out := exported{}
	add := func(name string, m *dto.Metric, extra ...string) {
		labels := out[name]
		if labels == nil {
			labels = map[string]map[string]bool{}
			out[name] = labels
		}
		for _, l := range m.GetLabel() {
			if labels[l.GetName()] == nil {
				labels[l.GetName()] = map[string]bool{}
			}
			labels[l.GetName()][l.GetValue()] = true
		}
		for _, l := range extra {
			if labels[l] == nil {
				labels[l] = map[string]bool{}
			}
		}
	}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch f.GetType() {
			case dto.MetricType_HISTOGRAM:
				add(f.GetName()+"_bucket", m, "le")
				add(f.GetName()+"_sum", m)
				add(f.GetName()+"_count", m)
			case dto.MetricType_SUMMARY:
				add(f.GetName(), m, "quantile")
				add(f.GetName()+"_sum", m)
				add(f.GetName()+"_count", m)
			default:
				add(f.GetName(), m)
			}
		}
	}
	return out
}

// router runs one gochannel router with one handler guarded by the
// receiver. The outermost middleware acks every delivery once the chain has
// returned, so a nack is measured once and not redelivered in a loop.
type router struct {
	t      *testing.T
	pubSub *gochannel.GoChannel
	done   chan string // the UUID of each delivery the chain returned from
}

func startRouter(t *testing.T, r *receiver.Receiver, name string, h message.HandlerFunc) *router {
	t.Helper()
	rt := &router{t: t, pubSub: gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{}), done: make(chan string, 16)}
	wr, err := message.NewRouter(message.RouterConfig{}, watermill.NopLogger{})
	if err != nil {
		t.Fatal(err)
	}
	hd := wr.AddConsumerHandler(name, name, rt.pubSub, func(m *message.Message) error {
		_, err := h(m)
		return err
	})
	hd.AddMiddleware(func(next message.HandlerFunc) message.HandlerFunc {
		return func(m *message.Message) ([]*message.Message, error) {
			defer func() { rt.done <- m.UUID }()
			_, _ = next(m) // measured inside; acked here
			return nil, nil
		}
	}, r.Middleware)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { _ = wr.Run(ctx); close(stopped) }()
	t.Cleanup(func() { cancel(); <-stopped; _ = rt.pubSub.Close() })
	<-wr.Running()
	return rt
}

// publish sends a copy of m (a message is acked once) and returns the
// channel its completion is reported on.
func (rt *router) publish(m *message.Message) chan string {
	rt.t.Helper()
	if err := rt.pubSub.Publish("payments", m.Copy()); err != nil {
		rt.t.Fatal(err)
	}
	return rt.done
}

// wait waits until the chain has returned from m.
func (rt *router) wait(done chan string, m *message.Message) {
	rt.t.Helper()
	select {
	case uuid := <-done:
		if uuid != m.UUID {
			rt.t.Fatalf("delivery %s returned while waiting for %s", uuid, m.UUID)
		}
	case <-time.After(10 * time.Second):
		rt.t.Fatalf("%s (%s) was not handled within 10s", m.UUID, m.Payload)
	}
}

// deliver publishes m and waits until the chain has returned from it.
func (rt *router) deliver(m *message.Message) { rt.wait(rt.publish(m), m) }
