// Command example-worker runs a payments workload through a Watermill router
// guarded by oncemill, injects the faults of at-least-once delivery, and
// checks the result: every valid payment took effect exactly once.
//
// It has three modes (--mode):
//
//   - run (default): producer and consumer in one process. With no flags it
//     runs on gochannel and the memory store, needs no service, and finishes
//     on its own. With --broker=kafka|amqp|sqs and --store=postgres|redis it
//     runs the same workload through a real broker and a shared store. Its
//     last line on stdout is the summary:
//
//     summary: published=N deliveries=D unique=U effects=E replays=R cached_failures=F double_effects=X lost=L msgs_per_sec=S
//
//     It exits 0 only when the run completed with double_effects=0 and
//     lost=0, 1 when a check failed or the run did not complete, 2 on bad flags.
//
//   - produce: publishes the workload (duplicates included, faults marked in
//     the commands) to the broker and exits.
//
//   - consume: the deployable worker. It consumes until SIGTERM or SIGINT,
//     then drains the messages in flight (--drain-timeout) and exits. It
//     serves /metrics (Prometheus), /healthz and /readyz on --http-addr and
//     logs JSON.
//
// Addresses come from flags or from ONCEMILL_* environment variables (see
// -h and docs/docker.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

// config is everything a run needs; flags fill it.
type config struct {
	Count      int // unique payment commands
	Partitions int // router handlers, one topic each

	// Fault rates, as fractions of the commands. A rate above zero always
	// selects at least one command, so every enabled fault occurs.
	Redeliver  float64 // the same message again, later
	Resend     float64 // the same content under a new UUID, later
	Concurrent float64 // the same message on two partitions at once
	Transient  float64 // the gateway times out the first time
	Permanent  float64 // invalid amount: a cached failure, no effect
	Stall      float64 // the gateway stalls for 1.5x the lease

	// Overlap is how long the gateway takes for a command delivered to two
	// partitions at once, so both copies are in handlers at the same time.
	Overlap time.Duration

	Lease    time.Duration // oncemill lease; heartbeat lease/3, in-progress wait 3x lease
	Timeout  time.Duration // give up (and fail) after this long
	Progress time.Duration // progress line interval on stderr; 0 turns it off
	InFlight int           // most deliveries published and not yet acked
	Seed     uint64        // picks the commands and their faults

	LogLevel      string
	LogFormat     string // text or json
	Broker        string
	Store         string
	NoIdempotency bool   // run the handler without oncemill (negative control)
	Key           string // content (canonical JSON without the envelope) or uuid

	Mode string // run, produce or consume

	// Where the services are; flags, else ONCEMILL_* variables, else these.
	PostgresDSN  string
	RedisAddr    string
	KafkaBrokers string // comma-separated
	AMQPURL      string
	AMQPClient   string // watermill-amqp major version: v3 or v2
	SQSEndpoint  string
	OTLPEndpoint string // OTLP/HTTP traces endpoint; empty: no traces exported

	// Names, so deployments and test runs do not collide.
	TopicPrefix   string // before every topic and queue name
	ConsumerGroup string // Kafka consumer group (one per topic: <group>-<topic>)
	Scope         string // oncemill key space and ledger scope
	PGSchema      string // schema of the records and ledger tables
	RedisPrefix   string // prefix of the records and ledger keys

	// Broker settings.
	KafkaPartitions      int           // partitions of each topic the worker creates
	KafkaSessionTimeout  time.Duration // consumer group session timeout
	SQSVisibilityTimeout time.Duration // of the queues the worker creates
	SQSWorkers           int           // concurrent receivers per queue

	// The deployable worker.
	HTTPAddr       string        // /metrics, /healthz, /readyz; empty: off
	DrainTimeout   time.Duration // how long SIGTERM waits for messages in flight
	GatewayLatency time.Duration // every simulated gateway call takes this long
	// HoldBeforeAck is fault injection for the integration tests: after the
	// handler chain succeeds for this payment_id (the effect and oncemill's
	// record are written), print a "hold:" line and block, never acking, so
	// the process can be killed between the effect and the ack.
	HoldBeforeAck string
}

func defaultConfig() config {
	return config{
		Count:      10000,
		Partitions: 8,
		Redeliver:  0.2,
		Resend:     0.1,
		Concurrent: 0.05,
		Transient:  0.05,
		Permanent:  0.02,
		Stall:      0.001,
		Overlap:    2 * time.Millisecond,
		Lease:      time.Second,
		Timeout:    2 * time.Minute,
		Progress:   time.Second,
		InFlight:   2048,
		Seed:       1,
		LogLevel:   "off",
		LogFormat:  "text",
		Broker:     "gochannel",
		Store:      "memory",
		Mode:       "run",
		Key:        "content",

		PostgresDSN:  env("ONCEMILL_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test"),
		RedisAddr:    env("ONCEMILL_REDIS_ADDR", "127.0.0.1:6379"),
		KafkaBrokers: env("ONCEMILL_KAFKA_BROKERS", "127.0.0.1:9092"),
		AMQPURL:      env("ONCEMILL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		AMQPClient:   env("ONCEMILL_AMQP_CLIENT", "v3"),
		SQSEndpoint:  env("ONCEMILL_SQS_ENDPOINT", "http://127.0.0.1:4566"),
		OTLPEndpoint: env("ONCEMILL_OTLP_ENDPOINT", ""),

		TopicPrefix:   env("ONCEMILL_TOPIC_PREFIX", ""),
		ConsumerGroup: env("ONCEMILL_CONSUMER_GROUP", "oncemill-worker"),
		Scope:         env("ONCEMILL_SCOPE", "payments"),
		PGSchema:      env("ONCEMILL_POSTGRES_SCHEMA", "oncemill"),
		RedisPrefix:   env("ONCEMILL_REDIS_PREFIX", "oncemill"),

		KafkaPartitions:      1,
		KafkaSessionTimeout:  10 * time.Second,
		SQSVisibilityTimeout: 30 * time.Second,
		SQSWorkers:           4,

		HTTPAddr:     env("ONCEMILL_HTTP_ADDR", ""),
		DrainTimeout: 30 * time.Second,
	}
}

// env returns the environment variable name, or def when it is unset or empty.
func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// Names accepted by --broker, --store and --log-level. Real brokers and stores
// are added in wiring.go and listed here.
var (
	brokers     = []string{"gochannel", "kafka", "amqp", "sqs"}
	stores      = []string{"memory", "postgres", "redis"}
	logLevels   = []string{"off", "error", "info", "debug", "trace"}
	logFormats  = []string{"text", "json"}
	modes       = []string{"run", "produce", "consume"}
	amqpClients = []string{"v3", "v2"}
	keyKinds    = []string{"content", "uuid"}
)

// parseFlags parses args (without the program name) into a validated config.
func parseFlags(args []string, output io.Writer) (config, error) {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("example-worker", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprintf(output, "Usage: example-worker [flags]\n\n"+
			"Publishes a payments workload with duplicate deliveries and failures,\n"+
			"processes it through oncemill and checks that every valid payment took\n"+
			"effect exactly once. The last stdout line is the summary.\n\nFlags:\n")
		fs.PrintDefaults()
	}

	fs.IntVar(&cfg.Count, "count", cfg.Count, "unique payment commands to publish")
	fs.IntVar(&cfg.Partitions, "partitions", cfg.Partitions, "router handlers, each on its own topic payments.<i>")
	fs.Float64Var(&cfg.Redeliver, "redeliver", cfg.Redeliver, "fraction of commands delivered again later (same UUID and payload)")
	fs.Float64Var(&cfg.Resend, "resend", cfg.Resend, "fraction of commands re-sent later under a new UUID, sent_at and attempt")
	fs.Float64Var(&cfg.Concurrent, "concurrent", cfg.Concurrent, "fraction of commands published to two partitions at the same moment")
	fs.Float64Var(&cfg.Transient, "transient", cfg.Transient, "fraction of commands whose first gateway call times out (retried)")
	fs.Float64Var(&cfg.Permanent, "permanent", cfg.Permanent, "fraction of commands with an invalid amount (cached failure, no effect)")
	fs.Float64Var(&cfg.Stall, "stall", cfg.Stall, "fraction of commands whose gateway call stalls for 1.5x the lease")
	fs.DurationVar(&cfg.Overlap, "overlap", cfg.Overlap, "gateway latency for commands published to two partitions at once, so the copies meet (0: none)")
	fs.DurationVar(&cfg.Lease, "lease", cfg.Lease, "oncemill lease; the heartbeat is lease/3 and in-progress duplicates wait up to 3x lease")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "fail if the workload is not fully acknowledged within this time")
	fs.DurationVar(&cfg.Progress, "progress", cfg.Progress, "interval of the progress line on stderr (0 turns it off)")
	fs.IntVar(&cfg.InFlight, "inflight", cfg.InFlight, "most deliveries published and not yet acknowledged")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed that picks the commands and their faults")
	fs.StringVar(&cfg.LogLevel, "log-level", cfg.LogLevel, "Watermill and oncemill log level on stderr: "+strings.Join(logLevels, ", ")+
		" (errors are expected in this workload and are counted in the progress line either way)")
	fs.StringVar(&cfg.Broker, "broker", cfg.Broker, "message broker: "+strings.Join(brokers, ", "))
	fs.StringVar(&cfg.Store, "store", cfg.Store, "idempotency store: "+strings.Join(stores, ", "))
	fs.BoolVar(&cfg.NoIdempotency, "no-idempotency", cfg.NoIdempotency, "run the handler without oncemill (a negative control, and a baseline for benchmarks)")

	fs.StringVar(&cfg.Mode, "mode", cfg.Mode, "run (producer and consumer in one process, then the summary), produce (publish the workload and exit) or consume (the deployable worker, until SIGTERM)")
	fs.StringVar(&cfg.Key, "key", cfg.Key, "who a command is: content (its canonical JSON without meta.sent_at and meta.attempt, so a re-send under a new UUID is the same key) or uuid (the message UUID)")
	fs.StringVar(&cfg.LogFormat, "log-format", cfg.LogFormat, "log format on stderr: text or json (consume mode: json unless set)")
	fs.StringVar(&cfg.PostgresDSN, "postgres-dsn", cfg.PostgresDSN, "PostgreSQL for --store=postgres [$ONCEMILL_POSTGRES_DSN]")
	fs.StringVar(&cfg.RedisAddr, "redis-addr", cfg.RedisAddr, "Redis for --store=redis [$ONCEMILL_REDIS_ADDR]")
	fs.StringVar(&cfg.KafkaBrokers, "kafka-brokers", cfg.KafkaBrokers, "comma-separated Kafka brokers for --broker=kafka [$ONCEMILL_KAFKA_BROKERS]")
	fs.StringVar(&cfg.AMQPURL, "amqp-url", cfg.AMQPURL, "RabbitMQ for --broker=amqp [$ONCEMILL_AMQP_URL]")
	fs.StringVar(&cfg.AMQPClient, "amqp-client", cfg.AMQPClient, "watermill-amqp major version for --broker=amqp: v3 or v2 [$ONCEMILL_AMQP_CLIENT]")
	fs.StringVar(&cfg.SQSEndpoint, "sqs-endpoint", cfg.SQSEndpoint, "SQS endpoint for --broker=sqs (region us-east-1, static credentials) [$ONCEMILL_SQS_ENDPOINT]")
	fs.StringVar(&cfg.OTLPEndpoint, "otlp-endpoint", cfg.OTLPEndpoint, "OTLP/HTTP endpoint for traces, e.g. http://jaeger:4318; empty: none [$ONCEMILL_OTLP_ENDPOINT]")
	fs.StringVar(&cfg.TopicPrefix, "topic-prefix", cfg.TopicPrefix, "prefix of every topic and queue (run mode on a real broker: a fresh one per run unless set) [$ONCEMILL_TOPIC_PREFIX]")
	fs.StringVar(&cfg.ConsumerGroup, "consumer-group", cfg.ConsumerGroup, "Kafka consumer group; each topic is consumed by <group>-<topic> [$ONCEMILL_CONSUMER_GROUP]")
	fs.StringVar(&cfg.Scope, "scope", cfg.Scope, "oncemill scope (key space) and ledger scope (run mode on a shared store: a fresh one per run) [$ONCEMILL_SCOPE]")
	fs.StringVar(&cfg.PGSchema, "postgres-schema", cfg.PGSchema, "schema of the records and ledger tables [$ONCEMILL_POSTGRES_SCHEMA]")
	fs.StringVar(&cfg.RedisPrefix, "redis-prefix", cfg.RedisPrefix, "prefix of the records and ledger keys [$ONCEMILL_REDIS_PREFIX]")
	fs.IntVar(&cfg.KafkaPartitions, "kafka-partitions", cfg.KafkaPartitions, "partitions of each Kafka topic the worker creates")
	fs.DurationVar(&cfg.KafkaSessionTimeout, "kafka-session-timeout", cfg.KafkaSessionTimeout, "Kafka consumer group session timeout: how long a crashed worker's partitions wait before another takes them")
	fs.DurationVar(&cfg.SQSVisibilityTimeout, "sqs-visibility-timeout", cfg.SQSVisibilityTimeout, "VisibilityTimeout of the SQS queues the worker creates: when a nacked or unacked message comes back (whole seconds)")
	fs.IntVar(&cfg.SQSWorkers, "sqs-workers", cfg.SQSWorkers, "concurrent receivers per SQS queue")
	fs.StringVar(&cfg.HTTPAddr, "http-addr", cfg.HTTPAddr, "address of /metrics, /healthz and /readyz; empty: off (consume mode: :8080 unless set) [$ONCEMILL_HTTP_ADDR]")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "on SIGTERM, how long to wait for messages in flight before exiting")
	fs.DurationVar(&cfg.GatewayLatency, "gateway-latency", cfg.GatewayLatency, "every simulated payment gateway call takes at least this long")
	fs.StringVar(&cfg.HoldBeforeAck, "hold-before-ack", cfg.HoldBeforeAck, "fault injection for tests: after this payment_id's effect is recorded, print a hold: line and never ack it")

	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	cfg.applyModeDefaults(set)
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("unexpected argument %q: example-worker takes flags only", fs.Arg(0))
	}
	if err := cfg.validate(); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// validate reports the first setting that cannot work, naming its flag.
func (c config) validate() error {
	rates := []struct {
		flag string
		v    float64
	}{
		{"redeliver", c.Redeliver}, {"resend", c.Resend}, {"concurrent", c.Concurrent},
		{"transient", c.Transient}, {"permanent", c.Permanent}, {"stall", c.Stall},
	}
	for _, r := range rates {
		if !(r.v >= 0 && r.v <= 1) { // also rejects NaN
			return fmt.Errorf("--%s=%v: a rate is a fraction of the commands, in [0,1]", r.flag, r.v)
		}
	}
	switch {
	case c.Count < 1:
		return fmt.Errorf("--count=%d: publish at least one command", c.Count)
	case c.Partitions < 1:
		return fmt.Errorf("--partitions=%d: run at least one partition", c.Partitions)
	case c.Partitions < 2 && (c.Concurrent > 0 || c.Stall > 0) && c.Mode != "consume":
		return fmt.Errorf("--partitions=%d: concurrent duplicates (--concurrent, and the duplicates of --stall) need at least 2 partitions", c.Partitions)
	case c.Transient+c.Permanent+c.Stall > 1:
		return fmt.Errorf("--transient + --permanent + --stall = %v: each command has at most one of these faults, so they must add up to at most 1",
			c.Transient+c.Permanent+c.Stall)
	case c.Lease <= 0:
		return fmt.Errorf("--lease=%v: must be above zero", c.Lease)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout=%v: must be above zero", c.Timeout)
	case c.Overlap < 0:
		return fmt.Errorf("--overlap=%v: use 0 for no added latency", c.Overlap)
	case c.Progress < 0:
		return fmt.Errorf("--progress=%v: use 0 to turn the progress line off", c.Progress)
	case c.InFlight < 2:
		return fmt.Errorf("--inflight=%d: allow at least 2 deliveries in flight (a concurrent duplicate is two)", c.InFlight)
	}
	if err := oneOf("log-level", c.LogLevel, logLevels); err != nil {
		return err
	}
	switch {
	case c.KafkaPartitions < 1:
		return fmt.Errorf("--kafka-partitions=%d: create at least one partition", c.KafkaPartitions)
	case c.KafkaSessionTimeout <= 0:
		return fmt.Errorf("--kafka-session-timeout=%v: must be above zero", c.KafkaSessionTimeout)
	case c.KafkaSessionTimeout >= 30*time.Second:
		return fmt.Errorf("--kafka-session-timeout=%v: must be below sarama's 30s network read timeout, which also bounds the rebalance (set to the session timeout)", c.KafkaSessionTimeout)
	case c.SQSVisibilityTimeout < time.Second || c.SQSVisibilityTimeout%time.Second != 0:
		return fmt.Errorf("--sqs-visibility-timeout=%v: SQS takes whole seconds, at least 1s", c.SQSVisibilityTimeout)
	case c.SQSWorkers < 1:
		return fmt.Errorf("--sqs-workers=%d: run at least one receiver", c.SQSWorkers)
	case c.DrainTimeout <= 0:
		return fmt.Errorf("--drain-timeout=%v: must be above zero", c.DrainTimeout)
	case c.GatewayLatency < 0:
		return fmt.Errorf("--gateway-latency=%v: use 0 for none", c.GatewayLatency)
	case c.Scope == "":
		return errors.New("--scope is empty: name the key space")
	case c.Mode == "consume" && c.Broker == "gochannel":
		return errors.New("--mode=consume with --broker=gochannel: gochannel lives in one process, so nothing could reach this worker; choose kafka, amqp or sqs")
	case c.Mode == "produce" && c.Broker == "gochannel":
		return errors.New("--mode=produce with --broker=gochannel: gochannel lives in one process, so no worker could read what is produced; choose kafka, amqp or sqs")
	}
	for _, f := range []struct {
		flag, v string
		allowed []string
	}{
		{"log-format", c.LogFormat, logFormats},
		{"broker", c.Broker, brokers},
		{"store", c.Store, stores},
		{"mode", c.Mode, modes},
		{"amqp-client", c.AMQPClient, amqpClients},
		{"key", c.Key, keyKinds},
	} {
		if err := oneOf(f.flag, f.v, f.allowed); err != nil {
			return err
		}
	}
	return nil
}

// applyModeDefaults adapts defaults where the flag was not set. A
// self-contained run on gochannel with a shared store keeps at most 32
// deliveries in flight: gochannel hands every published message to a
// handler at once, and thousands of handlers queueing for the store's
// connections would stall heartbeats past the lease (and, in PostgreSQL's
// one-transaction mode, each handler holds a pooled connection). The deployable
// worker (consume mode) logs at info in JSON and serves its HTTP endpoints
// on :8080.
func (c *config) applyModeDefaults(set map[string]bool) {
	if c.Mode == "run" && c.Store != "memory" && c.Broker == "gochannel" && !set["inflight"] {
		c.InFlight = 32
	}
	if c.Mode != "consume" {
		return
	}
	if !set["log-level"] {
		c.LogLevel = "info"
	}
	if !set["log-format"] {
		c.LogFormat = "json"
	}
	if !set["http-addr"] && c.HTTPAddr == "" {
		c.HTTPAddr = ":8080"
	}
}

func oneOf(flag, v string, allowed []string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("--%s=%q is not available; choose one of: %s", flag, v, strings.Join(allowed, ", "))
}

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// realMain returns the exit code: 0 when the run completed and passed its
// checks, 1 when it did not, 2 for bad flags.
func realMain(args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "example-worker: %v\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch cfg.Mode {
	case "produce":
		return exitCode(produce(ctx, cfg, stdout, stderr), stderr)
	case "consume":
		return exitCode(consume(ctx, cfg, stdout, stderr), stderr)
	}

	sum, err := run(ctx, cfg, stdout, stderr)
	var problems []string
	if err != nil {
		problems = append(problems, err.Error())
	}
	if err == nil || sum.Deliveries > 0 {
		problems = append(problems, sum.problems()...)
	}
	for _, p := range problems {
		fmt.Fprintf(stderr, "example-worker: FAIL: %s\n", p)
	}
	if len(problems) > 0 {
		return 1
	}
	return 0
}

// exitCode reports err of the produce or consume mode: 0 for none, else 1.
func exitCode(err error, stderr io.Writer) int {
	if err != nil {
		fmt.Fprintf(stderr, "example-worker: FAIL: %v\n", err)
		return 1
	}
	return 0
}
