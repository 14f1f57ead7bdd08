package main

// The modes: the demo (run), produce, and the deployable worker (consume).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
)

// worker is what every mode runs on.
type worker struct {
	cfg      config
	log      *slog.Logger
	keys     keygen.Generator
	stores   *stores
	broker   *broker
	registry *prometheus.Registry     // oncemill's metrics, on /metrics
	meters   *sdkmetric.MeterProvider // the registry's source
	tracer   *sdktrace.TracerProvider // nil without --otlp-endpoint
}

func (w *worker) topic(name string) string { return w.cfg.topicPrefix + name }

func (w *worker) payments(i int) string { return w.topic(fmt.Sprintf("payments-%d", i)) }

// open connects the store and the broker. fresh (the demo) gives the run
// its own scope and topics where other runs share them.
func open(ctx context.Context, cfg config, stderr io.Writer, fresh bool) (w *worker, closeAll func(), err error) {
	if id := watermill.NewShortUUID(); fresh {
		if cfg.store != "memory" {
			cfg.scope += "-run-" + id
		}
		if cfg.broker != "gochannel" && cfg.topicPrefix == "" {
			cfg.topicPrefix = "oncemill-run-" + id + "-"
		}
	}
	levels := map[string]slog.Level{"error": slog.LevelError, "info": slog.LevelInfo, "debug": slog.LevelDebug}
	var h slog.Handler = slog.DiscardHandler
	if l, ok := levels[cfg.logLevel]; ok && cfg.mode == "consume" {
		h = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: l})
	} else if ok {
		h = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: l})
	}
	w = &worker{cfg: cfg, log: slog.New(h), registry: prometheus.NewRegistry()}
	w.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(w.registry))
	if err != nil {
		return nil, nil, err
	}
	w.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	if cfg.otlpEndpoint != "" {
		spans, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(cfg.otlpEndpoint+"/v1/traces"))
		if err != nil {
			return nil, nil, err
		}
		w.tracer = sdktrace.NewTracerProvider(sdktrace.WithBatcher(spans))
	}
	// Who a command is: its content without the envelope fields a re-send
	// changes, so the same command under a new UUID is the same key.
	if w.keys, err = keygen.ContentHash(keygen.ContentHashOptions{Exclude: []string{"meta.sent_at", "meta.attempt"}, RejectNonJSON: true}); err != nil {
		return nil, nil, err
	}
	concurrency := cfg.partitions * max(1, map[string]int{"kafka": cfg.kafkaPartitions, "sqs": cfg.sqsWorkers}[cfg.broker])
	if w.stores, err = openStore(ctx, cfg, concurrency); err != nil {
		return nil, nil, err
	}
	topics := []string{w.topic("settlements"), w.topic("dead-letters")}
	for i := range cfg.partitions {
		topics = append(topics, w.payments(i))
	}
	if w.broker, err = openBroker(ctx, cfg, watermill.NewSlogLogger(w.log), topics); err != nil {
		w.stores.close()
		return nil, nil, err
	}
	return w, func() {
		_ = w.broker.pub.Close()
		w.stores.close()
		_ = w.meters.Shutdown(context.Background())
		if w.tracer != nil {
			_ = w.tracer.Shutdown(context.Background()) // flushes the spans
		}
	}, nil
}

// run runs the handler behind oncemill's receiver on every payments topic
// until ctx ends, then drains; running is closed once it consumes.
func (w *worker) run(ctx context.Context, drain time.Duration, onEvent func(pipeline.Event), running chan<- struct{}) error {
	r, err := w.newReceiver(onEvent)
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: drain}, watermill.NewSlogLogger(w.log))
	if err != nil {
		return err
	}
	for i := range w.cfg.partitions {
		sub, err := w.broker.sub(w.cfg.group + "-" + w.payments(i))
		if err != nil {
			return err
		}
		router.AddHandler(w.payments(i), w.payments(i), sub, w.topic("settlements"), keepOpen{w.broker.pub}, w.handle).
			AddMiddleware(finishOnShutdown, r.Middleware)
	}
	done := make(chan error, 1)
	go func() { done <- router.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-router.Running():
		close(running)
	case err := <-done:
		return fmt.Errorf("router stopped before running: %w", err)
	}
	select {
	case <-ctx.Done():
	case err := <-done:
		return fmt.Errorf("router stopped: %w", err)
	}
	w.log.Info("Draining the messages in flight", "timeout", drain.String())
	err = router.Close()
	<-done
	return err
}

// keepOpen is the publisher the handlers share: the router closes each
// handler's publisher when the handler stops.
type keepOpen struct{ message.Publisher }

func (keepOpen) Close() error { return nil }

// finishOnShutdown lets a delivery in flight finish during the drain
// (closing a subscriber cancels its messages' contexts). oncemill still
// cancels the handler if its lease is lost.
func finishOnShutdown(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		msg.SetContext(context.WithoutCancel(msg.Context()))
		return h(msg)
	}
}

// publish sends the workload: count commands, 2% with an invalid amount,
// 20% delivered again 16 commands later (same UUID), 10% re-sent then under
// a new UUID. sent, when set, is told of each delivery first. It returns the
// deliveries and the distinct keys among them.
func (w *worker) publish(sent func(uuid string)) (deliveries, unique int, err error) {
	type delivery struct {
		partition int
		msg       *message.Message
	}
	keys, later := map[string]bool{}, map[int][]delivery{}
	for i := range w.cfg.count + 16 {
		if i < w.cfg.count {
			cmd := command{PaymentID: fmt.Sprintf("p-%06d", i+1), Account: fmt.Sprintf("acc-%d", i%50+1), AmountCents: int64(i*7919%100000 + 1), Currency: "EUR"}
			if i%50 == 3 {
				cmd.AmountCents = -int64(i % 100)
			}
			var msgs []delivery
			for cmd.Meta.Attempt = 1; cmd.Meta.Attempt <= 1+btoi(i%10 == 3); cmd.Meta.Attempt++ {
				cmd.Meta.SentAt = time.Now().UTC().Format(time.RFC3339Nano)
				payload, _ := json.Marshal(cmd)
				msgs = append(msgs, delivery{i % w.cfg.partitions, message.NewMessage(watermill.NewUUID(), payload)})
				key, err := w.keys.Key(msgs[len(msgs)-1].msg)
				if err != nil {
					return deliveries, 0, err
				}
				keys[key] = true
			}
			if i%5 == 0 {
				msgs = append(msgs, msgs[0])
			}
			later[i] = append([]delivery{msgs[0]}, later[i]...)
			later[i+16] = append(later[i+16], msgs[1:]...)
		}
		for _, d := range later[i] {
			if sent != nil {
				sent(d.msg.UUID)
			}
			deliveries++
			if err := w.broker.pub.Publish(w.payments(d.partition), message.NewMessage(d.msg.UUID, d.msg.Payload)); err != nil {
				return deliveries, 0, err
			}
		}
	}
	return deliveries, len(keys), nil
}

// acks follows the demo's deliveries. A message acked as often as it was
// published is acked again only by the broker's own redelivery (SQS after
// the visibility timeout), which does not count.
type acks struct {
	mu                         sync.Mutex
	sent, acked                map[string]int
	pending, replays, failures int
	done                       chan struct{} // closed when nothing is pending
}

func (a *acks) send(uuid string) { a.mu.Lock(); a.sent[uuid]++; a.pending++; a.mu.Unlock() }

func (a *acks) event(ev pipeline.Event) {
	a.mu.Lock()
	defer a.mu.Unlock()
	switch ev.Outcome {
	case pipeline.OutcomeReplayed:
		a.replays++
	case pipeline.OutcomeCachedFailure, pipeline.OutcomeCachedFailureReplayed:
		a.failures++
	}
	if ev.Outcome.Acked() && a.acked[ev.MessageUUID] < a.sent[ev.MessageUUID] {
		a.acked[ev.MessageUUID]++
		if a.pending--; a.pending == 0 && a.done != nil {
			close(a.done)
		}
	}
}

// demo publishes the workload to its own router, waits until every delivery
// is acked, and checks the ledger: each valid payment charged exactly once.
func demo(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	w, closeAll, err := open(ctx, cfg, stderr, true)
	if err != nil {
		return err
	}
	defer closeAll()
	a := &acks{sent: map[string]int{}, acked: map[string]int{}}
	stop, running, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	runCtx, cancel := context.WithCancel(ctx)
	defer func() { cancel(); <-done }()
	go func() { done <- w.run(runCtx, 10*time.Second, a.event, running) }()
	select {
	case <-running:
	case err := <-done:
		done <- err
		return err
	}
	start := time.Now()
	deliveries, unique, err := w.publish(a.send)
	if err != nil {
		return err
	}
	a.mu.Lock()
	if a.done = stop; a.pending == 0 {
		close(stop)
	}
	a.mu.Unlock()
	select {
	case <-stop:
	case <-time.After(cfg.timeout):
		return fmt.Errorf("timed out after %v: %d of %d deliveries not acked", cfg.timeout, a.pending, deliveries)
	case <-ctx.Done():
		return ctx.Err()
	}
	elapsed := time.Since(start)
	counts, err := w.stores.counts(ctx)
	if err != nil {
		return fmt.Errorf("reading the ledger: %w", err)
	}
	effects, doubled, lost := 0, 0, 0
	for i := range cfg.count {
		n := counts[fmt.Sprintf("p-%06d", i+1)]
		effects, doubled = effects+n, doubled+max(n-1, 0)
		if n == 0 && i%50 != 3 {
			lost++
		}
	}
	fmt.Fprintf(stdout, "duplicates: redelivered=%d resent_new_uuid=%d invalid_amount=%d; elapsed %v\n",
		(cfg.count+4)/5, (cfg.count+6)/10, (cfg.count+46)/50, elapsed.Round(time.Millisecond))
	fmt.Fprintf(stdout, "summary: published=%d deliveries=%d unique=%d effects=%d replays=%d cached_failures=%d double_effects=%d lost=%d msgs_per_sec=%.0f\n",
		cfg.count, deliveries, unique, effects, a.replays, a.failures, doubled, lost, float64(deliveries)/elapsed.Seconds())
	return errors.Join(
		check(doubled == 0, "double_effects=%d: payments were charged more than once", doubled),
		check(lost == 0, "lost=%d: valid payments were never charged", lost),
		check(unique == cfg.count, "unique=%d but published=%d: the key generator does not map each command to one key", unique, cfg.count))
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

func check(ok bool, format string, args ...any) error {
	if ok {
		return nil
	}
	return fmt.Errorf(format, args...)
}

// produce publishes the workload for workers in other processes.
func produce(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	w, closeAll, err := open(ctx, cfg, stderr, false)
	if err != nil {
		return err
	}
	defer closeAll()
	deliveries, unique, err := w.publish(nil)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "produced: commands=%d deliveries=%d unique=%d topics=%s..%s\n", cfg.count, deliveries, unique, w.payments(0), w.payments(cfg.partitions-1))
	return nil
}

// consume is the deployable worker: it consumes until SIGTERM, then stops
// taking messages and waits up to --drain-timeout for those in flight. A
// delivery that finishes during the drain may lose its ack and come back
// after the restart: oncemill replays it.
func consume(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	w, closeAll, err := open(ctx, cfg, stderr, false)
	if err != nil {
		return err
	}
	defer closeAll()
	var deliveries atomic.Int64
	var ready atomic.Bool
	if cfg.httpAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(w.registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "ok") })
		mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			if !ready.Load() || w.stores.ping(ctx) != nil { // consuming, and the store answers
				http.Error(rw, "not ready", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(rw, "ready")
		})
		ln, err := net.Listen("tcp", cfg.httpAddr)
		if err != nil {
			return err
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		fmt.Fprintf(stdout, "listening: http://%s\n", ln.Addr())
	}
	running := make(chan struct{})
	go func() {
		<-running
		ready.Store(true)
		fmt.Fprintln(stdout, "consuming:", w.payments(0), "to", w.payments(cfg.partitions-1))
		w.log.Info("Consuming", "broker", cfg.broker, "store", cfg.store, "partitions", cfg.partitions)
	}()
	err = w.run(ctx, cfg.drainTimeout, func(ev pipeline.Event) {
		deliveries.Add(1)
		w.log.Debug("delivery", "outcome", ev.Outcome.String(), "message_uuid", ev.MessageUUID, "key", ev.Key, "attempt", ev.Attempt)
	}, running)
	ready.Store(false)
	fmt.Fprintf(stdout, "consumed: deliveries=%d\n", deliveries.Load())
	return err
}
