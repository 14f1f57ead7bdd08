// Command example-worker is oncemill's example: a payments worker on
// Watermill whose handler charges each payment once, however often the
// broker delivers the command. Copy handler.go (the handler, oncemill's
// receiver around it, the stores), brokers.go and main.go (the modes).
//
// --mode=run (the default) is the demo: it publishes payment commands to
// itself with the duplicates of at-least-once delivery and some invalid
// amounts, waits until each delivery is acked, and counts the ledger. With
// no flags it needs no service (gochannel, the memory store). Its last line:
//
//	summary: published=N deliveries=D unique=U effects=E replays=R cached_failures=F double_effects=X lost=L msgs_per_sec=S
//
// --mode=produce publishes the same workload to a broker; --mode=consume is
// the deployable worker: /metrics, /healthz and /readyz on --http-addr, and
// a drain of the messages in flight on SIGTERM. Exit codes: 0 success, 1 a
// failed run or check (a payment charged twice or lost), 2 bad flags.
package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
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

// config is what the flags say.
type config struct {
	mode, broker, store, logLevel, httpAddr, otlpEndpoint, scope, topicPrefix string
	postgresDSN, postgresSchema, redisAddr, redisPrefix                       string
	kafkaBrokers, amqpURL, sqsEndpoint, group                                 string
	partitions, count                                                         int
	lease, timeout, drainTimeout, kafkaSession, sqsVisibility                 time.Duration
}

func parseFlags(args []string, out io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("example-worker", flag.ContinueOnError)
	fs.SetOutput(out)
	fs.Usage = func() {
		fmt.Fprint(out, "Usage: example-worker [flags]\n\noncemill's example payments worker; without flags, the demo.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	str := func(p *string, name, env, def, usage string) { // the default from $env when set
		if env != "" {
			def, usage = cmp.Or(os.Getenv(env), def), usage+" [$"+env+"]"
		}
		fs.StringVar(p, name, def, usage)
	}
	str(&c.mode, "mode", "", "run", "run (the demo), produce (publish the demo's workload) or consume (the deployable worker)")
	str(&c.broker, "broker", "", "gochannel", "gochannel (run mode only), kafka, amqp or sqs")
	str(&c.store, "store", "", "memory", "memory, postgres (the one-transaction mode) or redis")
	str(&c.logLevel, "log-level", "", "off", "off, error, info or debug (consume mode: info, in JSON)")
	str(&c.httpAddr, "http-addr", "ONCEMILL_HTTP_ADDR", "", "address of /metrics, /healthz and /readyz (consume mode: :8080)")
	str(&c.otlpEndpoint, "otlp-endpoint", "ONCEMILL_OTLP_ENDPOINT", "", "OTLP/HTTP endpoint for traces, e.g. http://jaeger:4318")
	str(&c.scope, "scope", "ONCEMILL_SCOPE", "payments", "oncemill scope and ledger scope (run mode on a shared store: a fresh one per run)")
	str(&c.topicPrefix, "topic-prefix", "ONCEMILL_TOPIC_PREFIX", "", "prefix of the topics payments-0, payments-1, ..., settlements, dead-letters")
	str(&c.group, "consumer-group", "ONCEMILL_CONSUMER_GROUP", "oncemill-worker", "Kafka: each topic is read by the consumer group <group>-<topic>")
	str(&c.postgresDSN, "postgres-dsn", "ONCEMILL_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL")
	str(&c.postgresSchema, "postgres-schema", "ONCEMILL_POSTGRES_SCHEMA", "oncemill", "schema of the records and ledger tables")
	str(&c.redisAddr, "redis-addr", "ONCEMILL_REDIS_ADDR", "127.0.0.1:6379", "Redis")
	str(&c.redisPrefix, "redis-prefix", "ONCEMILL_REDIS_PREFIX", "oncemill", "prefix of the records and ledger keys")
	str(&c.kafkaBrokers, "kafka-brokers", "ONCEMILL_KAFKA_BROKERS", "127.0.0.1:9092", "comma-separated Kafka brokers")
	str(&c.amqpURL, "amqp-url", "ONCEMILL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ")
	str(&c.sqsEndpoint, "sqs-endpoint", "ONCEMILL_SQS_ENDPOINT", "http://127.0.0.1:4566", "SQS (region us-east-1, static credentials)")
	fs.IntVar(&c.partitions, "partitions", 8, "router handlers, each on its own topic: payments-0, payments-1, ...")
	fs.IntVar(&c.count, "count", 10000, "payment commands to publish (run and produce modes)")
	fs.DurationVar(&c.lease, "lease", time.Second, "oncemill lease; a duplicate waits up to 3x lease for a running one")
	fs.DurationVar(&c.timeout, "timeout", 2*time.Minute, "fail if the workload is not done within this time (run and produce modes)")
	fs.DurationVar(&c.drainTimeout, "drain-timeout", 30*time.Second, "on SIGTERM, how long to wait for messages in flight")
	fs.DurationVar(&c.kafkaSession, "kafka-session-timeout", 10*time.Second, "Kafka group session and rebalance timeout, below 30s")
	fs.DurationVar(&c.sqsVisibility, "sqs-visibility-timeout", 30*time.Second, "VisibilityTimeout of the SQS queues, whole seconds")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q: example-worker takes flags only", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if c.mode == "consume" && !set["log-level"] {
		c.logLevel = "info"
	}
	if c.mode == "consume" && c.httpAddr == "" && !set["http-addr"] {
		c.httpAddr = ":8080"
	}
	return c, c.validate()
}

// validate reports the first setting that cannot work, naming its flag.
func (c config) validate() error {
	for name, v := range map[string]string{"mode": c.mode + "|run|produce|consume", "broker": c.broker + "|gochannel|kafka|amqp|sqs",
		"store": c.store + "|memory|postgres|redis", "log-level": c.logLevel + "|off|error|info|debug"} {
		if allowed := strings.Split(v, "|"); !slices.Contains(allowed[1:], allowed[0]) {
			return fmt.Errorf("--%s=%q is not available; choose one of: %s", name, allowed[0], strings.Join(allowed[1:], ", "))
		}
	}
	switch {
	case c.count < 1 || c.partitions < 1:
		return fmt.Errorf("--count=%d --partitions=%d: each must be at least 1", c.count, c.partitions)
	case c.lease <= 0 || c.timeout <= 0 || c.drainTimeout <= 0:
		return fmt.Errorf("--lease=%v --timeout=%v --drain-timeout=%v: each must be above zero", c.lease, c.timeout, c.drainTimeout)
	case c.kafkaSession <= 0 || c.kafkaSession >= 30*time.Second:
		return fmt.Errorf("--kafka-session-timeout=%v: must be above zero and below 30s (sarama's read timeout is 5s above it)", c.kafkaSession)
	case c.sqsVisibility < time.Second || c.sqsVisibility%time.Second != 0:
		return fmt.Errorf("--sqs-visibility-timeout=%v: SQS takes whole seconds, at least 1s", c.sqsVisibility)
	case c.scope == "":
		return errors.New("--scope is empty: name the key space")
	case c.mode != "run" && c.broker == "gochannel":
		return fmt.Errorf("--mode=%s with --broker=gochannel: gochannel lives in one process; choose kafka, amqp or sqs", c.mode)
	}
	return nil
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

func realMain(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil {
		fmt.Fprintf(stderr, "example-worker: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	w, err := open(ctx, cfg, stderr)
	if err == nil {
		defer w.close()
		switch cfg.mode {
		case "produce":
			err = w.produce(stdout)
		case "consume":
			err = w.consume(ctx, stdout)
		default:
			err = w.demo(ctx, stdout)
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "example-worker: FAIL: %v\n", err)
		return 1
	}
	return 0
}

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

// open connects the store and the broker. The demo gets a scope and topics
// of its own where other runs share them.
func open(ctx context.Context, cfg config, stderr io.Writer) (w *worker, err error) {
	if id := watermill.NewShortUUID(); cfg.mode == "run" {
		if cfg.store != "memory" {
			cfg.scope += "-run-" + id
		}
		if cfg.broker != "gochannel" && cfg.topicPrefix == "" {
			cfg.topicPrefix = "oncemill-run-" + id + "-"
		}
	}
	var h slog.Handler = slog.DiscardHandler
	if l, ok := map[string]slog.Level{"error": slog.LevelError, "info": slog.LevelInfo, "debug": slog.LevelDebug}[cfg.logLevel]; ok {
		h = slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: l})
		if cfg.mode == "consume" {
			h = slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: l})
		}
	}
	w = &worker{cfg: cfg, log: slog.New(h), registry: prometheus.NewRegistry()}
	// Who a command is: its content without the envelope fields a re-send
	// changes, so the same command under a new UUID is the same key.
	if w.keys, err = keygen.ContentHash(keygen.ContentHashOptions{Exclude: []string{"meta.sent_at", "meta.attempt"}, RejectNonJSON: true}); err != nil {
		return nil, err
	}
	w.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(w.registry))
	if err != nil {
		return nil, err
	}
	w.meters = sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp))
	if cfg.otlpEndpoint != "" {
		spans, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(cfg.otlpEndpoint+"/v1/traces"))
		if err != nil {
			return nil, err
		}
		w.tracer = sdktrace.NewTracerProvider(sdktrace.WithBatcher(spans))
	}
	if w.stores, err = openStore(ctx, cfg); err != nil {
		return nil, err
	}
	topics := []string{w.topic("settlements"), w.topic("dead-letters")}
	for i := range cfg.partitions {
		topics = append(topics, w.payments(i))
	}
	if w.broker, err = openBroker(ctx, cfg, watermill.NewSlogLogger(w.log), topics); err != nil {
		w.stores.close()
		return nil, err
	}
	return w, nil
}

func (w *worker) close() {
	_ = w.broker.pub.Close()
	w.stores.close()
	_ = w.meters.Shutdown(context.Background())
	if w.tracer != nil {
		_ = w.tracer.Shutdown(context.Background()) // flushes the spans
	}
}

// router runs the handler behind oncemill's receiver on every payments
// topic; it returns once the router consumes.
func (w *worker) router(drain time.Duration, onEvent func(pipeline.Event)) (*message.Router, error) {
	r, err := w.newReceiver(onEvent)
	if err != nil {
		return nil, err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: drain}, watermill.NewSlogLogger(w.log))
	for i := 0; i < w.cfg.partitions && err == nil; i++ {
		var sub message.Subscriber
		if sub, err = w.broker.sub(w.cfg.group + "-" + w.payments(i)); err == nil {
			router.AddHandler(w.payments(i), w.payments(i), sub, w.topic("settlements"), keepOpen{w.broker.pub}, w.handle).
				AddMiddleware(finishOnShutdown, r.Middleware)
		}
	}
	if err != nil {
		return nil, err
	}
	done := make(chan error, 1)
	go func() { done <- router.Run(context.Background()) }()
	select {
	case <-router.Running():
		return router, nil
	case err := <-done:
		return nil, fmt.Errorf("router stopped before running: %w", err)
	}
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

// publish sends the workload: --count commands, 2% with an invalid amount;
// 20% delivered twice (same UUID) and 10% re-sent under a new UUID, as
// at-least-once delivery does. It returns the deliveries and the distinct
// keys among them.
func (w *worker) publish() (deliveries, unique int, err error) {
	keys := map[string]bool{}
	for i := range w.cfg.count {
		cmd := command{PaymentID: fmt.Sprintf("p-%06d", i+1), Account: fmt.Sprintf("acc-%d", i%50+1), AmountCents: int64(i*7919%100000 + 1), Currency: "EUR"}
		if i%50 == 3 {
			cmd.AmountCents = -int64(i % 100)
		}
		var msgs []*message.Message
		for cmd.Meta.Attempt = 1; cmd.Meta.Attempt == 1 || cmd.Meta.Attempt == 2 && i%10 == 3; cmd.Meta.Attempt++ {
			cmd.Meta.SentAt = time.Now().UTC().Format(time.RFC3339Nano)
			payload, _ := json.Marshal(cmd)
			msgs = append(msgs, message.NewMessage(watermill.NewUUID(), payload))
			key, err := w.keys.Key(msgs[len(msgs)-1])
			if err != nil {
				return deliveries, 0, err
			}
			keys[key] = true
		}
		if i%5 == 0 {
			msgs = append(msgs, msgs[0])
		}
		for _, msg := range msgs {
			deliveries++
			if err := w.broker.pub.Publish(w.payments(i%w.cfg.partitions), message.NewMessage(msg.UUID, msg.Payload)); err != nil {
				return deliveries, 0, err
			}
		}
	}
	return deliveries, len(keys), nil
}

// demo publishes the workload to its own router, waits until every delivery
// is acked, and checks the ledger: each valid payment charged exactly once.
func (w *worker) demo(ctx context.Context, stdout io.Writer) error {
	var acked, replays, failures atomic.Int64
	router, err := w.router(10*time.Second, func(ev pipeline.Event) {
		switch ev.Outcome {
		case pipeline.OutcomeReplayed:
			replays.Add(1)
		case pipeline.OutcomeCachedFailure, pipeline.OutcomeCachedFailureReplayed:
			failures.Add(1)
		}
		if ev.Outcome.Acked() {
			acked.Add(1)
		}
	})
	if err != nil {
		return err
	}
	defer router.Close()
	start := time.Now()
	deliveries, unique, err := w.publish()
	for deadline := time.After(w.cfg.timeout); err == nil && acked.Load() < int64(deliveries); {
		select {
		case <-deadline:
			err = fmt.Errorf("timed out after %v: %d of %d deliveries acked", w.cfg.timeout, acked.Load(), deliveries)
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err != nil {
		return err
	}
	elapsed := time.Since(start)
	counts, err := w.stores.counts(ctx)
	if err != nil {
		return fmt.Errorf("reading the ledger: %w", err)
	}
	n, effects, doubled, lost := w.cfg.count, 0, 0, 0
	for i := range n {
		c := counts[fmt.Sprintf("p-%06d", i+1)]
		if effects, doubled = effects+c, doubled+max(c-1, 0); c == 0 && i%50 != 3 {
			lost++
		}
	}
	fmt.Fprintf(stdout, "duplicates: redelivered=%d resent_new_uuid=%d invalid_amount=%d; elapsed %v\n", (n+4)/5, (n+6)/10, (n+46)/50, elapsed.Round(time.Millisecond))
	fmt.Fprintf(stdout, "summary: published=%d deliveries=%d unique=%d effects=%d replays=%d cached_failures=%d double_effects=%d lost=%d msgs_per_sec=%.0f\n",
		n, deliveries, unique, effects, replays.Load(), failures.Load(), doubled, lost, float64(deliveries)/elapsed.Seconds())
	switch {
	case doubled > 0:
		return fmt.Errorf("double_effects=%d: payments were charged more than once", doubled)
	case lost > 0:
		return fmt.Errorf("lost=%d: valid payments were never charged", lost)
	case unique != n:
		return fmt.Errorf("unique=%d but published=%d: the key generator does not map each command to one key", unique, n)
	}
	return nil
}

// produce publishes the workload for workers in other processes.
func (w *worker) produce(stdout io.Writer) error {
	deliveries, unique, err := w.publish()
	if err == nil {
		fmt.Fprintf(stdout, "produced: commands=%d deliveries=%d unique=%d topics=%s..%s\n", w.cfg.count, deliveries, unique, w.payments(0), w.payments(w.cfg.partitions-1))
	}
	return err
}

// consume is the deployable worker: it consumes until SIGTERM, then stops
// taking messages and waits up to --drain-timeout for those in flight. A
// delivery that finishes during the drain may lose its ack and come back
// after the restart: oncemill replays it.
func (w *worker) consume(ctx context.Context, stdout io.Writer) error {
	var deliveries atomic.Int64
	router, err := w.router(w.cfg.drainTimeout, func(ev pipeline.Event) {
		deliveries.Add(1)
		w.log.Debug("Delivery", "outcome", ev.Outcome.String(), "message_uuid", ev.MessageUUID, "key", ev.Key, "attempt", ev.Attempt)
	})
	if err != nil {
		return err
	}
	if w.cfg.httpAddr != "" {
		mux := http.NewServeMux()
		mux.Handle("GET /metrics", promhttp.HandlerFor(w.registry, promhttp.HandlerOpts{}))
		mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) { fmt.Fprintln(rw, "ok") })
		mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, r *http.Request) {
			ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
			defer cancel()
			if !router.IsRunning() || w.stores.ping(ctx) != nil { // consuming, and the store answers
				http.Error(rw, "not ready", http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(rw, "ready")
		})
		ln, err := net.Listen("tcp", w.cfg.httpAddr)
		if err != nil {
			_ = router.Close()
			return err
		}
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		fmt.Fprintf(stdout, "listening: http://%s\n", ln.Addr())
	}
	fmt.Fprintln(stdout, "consuming:", w.payments(0), "to", w.payments(w.cfg.partitions-1))
	w.log.Info("Consuming", "broker", w.cfg.broker, "store", w.cfg.store, "partitions", w.cfg.partitions)
	<-ctx.Done()
	w.log.Info("Draining the messages in flight", "timeout", w.cfg.drainTimeout.String())
	err = router.Close()
	fmt.Fprintf(stdout, "consumed: deliveries=%d\n", deliveries.Load())
	return err
}
