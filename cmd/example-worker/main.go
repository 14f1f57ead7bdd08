// Command example-worker is oncemill's example: a payments worker on
// Watermill whose handler charges each payment once, however often the
// broker delivers the command. Copy handler.go (the handler and oncemill's
// receiver), brokers.go and run.go (the demo and the deployable worker).
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
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"
)

// config is what the flags say.
type config struct {
	mode, broker, store, logLevel, httpAddr, otlpEndpoint      string
	scope, topicPrefix, group, postgresDSN, postgresSchema     string
	redisAddr, redisPrefix, kafkaBrokers, amqpURL, sqsEndpoint string
	partitions, count, kafkaPartitions, sqsWorkers             int
	lease, timeout, drainTimeout, kafkaSession, sqsVisibility  time.Duration
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
		if v := os.Getenv(env); env != "" && v != "" {
			def = v
		}
		if env != "" {
			usage += " [$" + env + "]"
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
	str(&c.group, "consumer-group", "ONCEMILL_CONSUMER_GROUP", "oncemill-worker", "Kafka consumer group: <group>-<topic>")
	str(&c.postgresDSN, "postgres-dsn", "ONCEMILL_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test", "PostgreSQL")
	str(&c.postgresSchema, "postgres-schema", "ONCEMILL_POSTGRES_SCHEMA", "oncemill", "schema of the records and ledger tables")
	str(&c.redisAddr, "redis-addr", "ONCEMILL_REDIS_ADDR", "127.0.0.1:6379", "Redis")
	str(&c.redisPrefix, "redis-prefix", "ONCEMILL_REDIS_PREFIX", "oncemill", "prefix of the records and ledger keys")
	str(&c.kafkaBrokers, "kafka-brokers", "ONCEMILL_KAFKA_BROKERS", "127.0.0.1:9092", "comma-separated Kafka brokers")
	str(&c.amqpURL, "amqp-url", "ONCEMILL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/", "RabbitMQ")
	str(&c.sqsEndpoint, "sqs-endpoint", "ONCEMILL_SQS_ENDPOINT", "http://127.0.0.1:4566", "SQS (region us-east-1, static credentials)")
	fs.IntVar(&c.partitions, "partitions", 8, "router handlers, each on its own topic: payments-0, payments-1, ...")
	fs.IntVar(&c.count, "count", 10000, "payment commands to publish (run and produce modes)")
	fs.IntVar(&c.kafkaPartitions, "kafka-partitions", 1, "partitions of each Kafka topic the worker creates")
	fs.IntVar(&c.sqsWorkers, "sqs-workers", 4, "concurrent receivers per SQS queue")
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
	case c.count < 1 || c.partitions < 1 || c.kafkaPartitions < 1 || c.sqsWorkers < 1:
		return fmt.Errorf("--count=%d --partitions=%d --kafka-partitions=%d --sqs-workers=%d: each must be at least 1", c.count, c.partitions, c.kafkaPartitions, c.sqsWorkers)
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
	}
	if err != nil {
		fmt.Fprintf(stderr, "example-worker: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	switch cfg.mode {
	case "produce":
		err = produce(ctx, cfg, stdout, stderr)
	case "consume":
		err = consume(ctx, cfg, stdout, stderr)
	default:
		err = demo(ctx, cfg, stdout, stderr)
	}
	if err != nil {
		fmt.Fprintf(stderr, "example-worker: FAIL: %v\n", err)
		return 1
	}
	return 0
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}
