package worker

import (
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
)

// Config is everything the worker needs; flags fill it (RegisterFlags).
type Config struct {
	Mode   string // run, produce or consume
	Broker string
	Store  string
	// Ledger is where the handler books its charges: "store" (beside the
	// records) or "postgres" (a PostgreSQL table apart from a memory or
	// Redis store, at LedgerPostgresDSN).
	Ledger string

	Partitions int           // router handlers, one topic each: payments-0, payments-1, ...
	Lease      time.Duration // oncemill lease; heartbeat lease/3, held-key wait 3x lease
	Progress   time.Duration // progress interval; 0 turns it off

	// The demo (run and produce modes).
	Count    int           // unique payment commands
	Timeout  time.Duration // give up (and fail) after this long
	InFlight int           // most deliveries published and not yet acked
	Seed     uint64        // picks the commands and their duplicates

	Key       string // content (canonical JSON without the envelope) or uuid
	LogLevel  string
	LogFormat string // text or json

	// Where the services are; flags, else ONCEMILL_* variables, else these.
	PostgresDSN       string
	LedgerPostgresDSN string // PostgreSQL of --ledger=postgres; empty: PostgresDSN
	RedisAddr         string
	RedisSentinel     string // comma-separated Sentinels; set: RedisAddr is not used
	RedisMaster       string // the primary's name at RedisSentinel
	KafkaBrokers      string // comma-separated
	AMQPURL           string
	SQSEndpoint       string
	NATSURL           string
	OTLPEndpoint      string // OTLP/HTTP traces endpoint; empty: no traces exported

	// Names, so deployments and test runs do not collide.
	TopicPrefix   string // before every topic and queue name
	ConsumerGroup string // Kafka consumer group (one per topic: <group>-<topic>)
	Scope         string // oncemill key space and ledger scope
	PGSchema      string // schema of the records and ledger tables
	RedisPrefix   string // prefix of the records and ledger keys

	// Redis store settings.
	RedisWaitReplicas int           // redisstore.Options.WaitReplicas
	RedisWaitTimeout  time.Duration // redisstore.Options.WaitTimeout

	// Broker settings.
	KafkaPartitions      int           // partitions of each topic the worker creates
	KafkaSessionTimeout  time.Duration // consumer group session timeout
	KafkaWatermark       bool          // the watermark mode of the one-transaction receiver (postgres on kafka)
	SQSVisibilityTimeout time.Duration // of the queues the worker creates
	SQSWorkers           int           // concurrent receivers per queue
	NATSAckWait          time.Duration // JetStream consumers' AckWait
	NATSMaxDeliver       int           // JetStream consumers' MaxDeliver; -1: no cap
	NATSMaxAckPending    int           // JetStream consumers' MaxAckPending

	// The deployable worker.
	HTTPAddr     string        // /metrics, /healthz, /readyz; empty: off
	DrainTimeout time.Duration // how long SIGTERM waits for messages in flight
}

// DefaultConfig is the configuration without flags.
func DefaultConfig() Config {
	return Config{
		Mode:       "run",
		Broker:     "gochannel",
		Store:      "memory",
		Ledger:     "store",
		Partitions: 8,
		Lease:      time.Second,
		Progress:   time.Second,
		Count:      10000,
		Timeout:    2 * time.Minute,
		InFlight:   2048,
		Seed:       1,
		Key:        "content",
		LogLevel:   "off",
		LogFormat:  "text",

		PostgresDSN:       Env("ONCEMILL_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test"),
		LedgerPostgresDSN: Env("ONCEMILL_LEDGER_POSTGRES_DSN", ""),
		RedisAddr:         Env("ONCEMILL_REDIS_ADDR", "127.0.0.1:6379"),
		RedisSentinel:     Env("ONCEMILL_REDIS_SENTINEL", ""),
		RedisMaster:       "mymaster",
		KafkaBrokers:      Env("ONCEMILL_KAFKA_BROKERS", "127.0.0.1:9092"),
		AMQPURL:           Env("ONCEMILL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/"),
		SQSEndpoint:       Env("ONCEMILL_SQS_ENDPOINT", "http://127.0.0.1:4566"),
		NATSURL:           Env("ONCEMILL_NATS_URL", "nats://127.0.0.1:4222"),
		OTLPEndpoint:      Env("ONCEMILL_OTLP_ENDPOINT", ""),

		TopicPrefix:   Env("ONCEMILL_TOPIC_PREFIX", ""),
		ConsumerGroup: Env("ONCEMILL_CONSUMER_GROUP", "oncemill-worker"),
		Scope:         Env("ONCEMILL_SCOPE", "payments"),
		PGSchema:      Env("ONCEMILL_POSTGRES_SCHEMA", "public"),
		RedisPrefix:   Env("ONCEMILL_REDIS_PREFIX", "oncemill"),

		KafkaPartitions:      1,
		KafkaSessionTimeout:  10 * time.Second,
		SQSVisibilityTimeout: 30 * time.Second,
		SQSWorkers:           4,
		NATSAckWait:          time.Minute,
		NATSMaxDeliver:       -1,
		NATSMaxAckPending:    1,

		HTTPAddr:     Env("ONCEMILL_HTTP_ADDR", ""),
		DrainTimeout: 30 * time.Second,
	}
}

// Env returns the environment variable name, or def when it is unset or empty.
func Env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// The names --broker, --store, --ledger, --mode, --log-level, --log-format and --key accept.
var (
	brokerNames = []string{"gochannel", "kafka", "amqp", "sqs", "nats"}
	storeNames  = []string{"memory", "postgres", "redis", "tiered"}
	ledgerNames = []string{"store", "postgres"}
	modeNames   = []string{"run", "produce", "consume"}
	logLevels   = []string{"off", "error", "info", "debug", "trace"}
	logFormats  = []string{"text", "json"}
	keyKinds    = []string{"content", "uuid"}
)

// RegisterFlags defines the example worker's flags on fs, filling c.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Mode, "mode", c.Mode, "run (the demo: producer and consumer in one process, then the summary line), produce (publish the demo workload and exit) or consume (the deployable worker, until SIGTERM)")
	fs.StringVar(&c.Broker, "broker", c.Broker, "message broker: "+strings.Join(brokerNames, ", "))
	fs.StringVar(&c.Store, "store", c.Store, "idempotency store: "+strings.Join(storeNames, ", ")+" (postgres, tiered: the one-transaction mode; tiered: postgres behind a local and a Redis cache, at --redis-addr or --redis-sentinel)")
	fs.StringVar(&c.Ledger, "ledger", c.Ledger, "where the handler books its charges: store (beside the records: in memory, in the postgres store's transaction, in a Redis hash) or postgres (a table in --postgres-schema at --ledger-postgres-dsn, apart from a memory or redis store: the lease mode's effect outside the record, checked on attempt 2 and later)")
	fs.IntVar(&c.Partitions, "partitions", c.Partitions, "router handlers, each on its own topic: payments-0, payments-1, ... (after --topic-prefix)")
	fs.DurationVar(&c.Lease, "lease", c.Lease, "oncemill lease; the heartbeat is lease/3 and a duplicate waits up to 3x lease for a running one")
	fs.DurationVar(&c.Progress, "progress", c.Progress, "progress interval: a line on stderr in run mode, a log record in consume mode (there 10s unless set); 0 turns it off")
	fs.IntVar(&c.Count, "count", c.Count, "run and produce modes: unique payment commands to publish (duplicates come on top)")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "run and produce modes: fail if the workload is not done within this time")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "log level on stderr: "+strings.Join(logLevels, ", ")+" (consume mode: info unless set)")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "log format on stderr: text or json (consume mode: json unless set)")

	fs.StringVar(&c.PostgresDSN, "postgres-dsn", c.PostgresDSN, "PostgreSQL for --store=postgres [$ONCEMILL_POSTGRES_DSN]")
	fs.StringVar(&c.LedgerPostgresDSN, "ledger-postgres-dsn", c.LedgerPostgresDSN, "PostgreSQL for --ledger=postgres; empty: --postgres-dsn [$ONCEMILL_LEDGER_POSTGRES_DSN]")
	fs.StringVar(&c.RedisAddr, "redis-addr", c.RedisAddr, "Redis for --store=redis [$ONCEMILL_REDIS_ADDR]")
	fs.StringVar(&c.RedisSentinel, "redis-sentinel", c.RedisSentinel, "comma-separated Sentinels for --store=redis: the worker follows the primary they name through failovers (go-redis's failover client) instead of --redis-addr [$ONCEMILL_REDIS_SENTINEL]")
	fs.StringVar(&c.RedisMaster, "redis-master", c.RedisMaster, "the primary's name at --redis-sentinel")
	fs.IntVar(&c.RedisWaitReplicas, "redis-wait-replicas", c.RedisWaitReplicas, "--store=redis: replicas that must acknowledge each record write (WAIT) before it counts; 0: no WAIT")
	fs.DurationVar(&c.RedisWaitTimeout, "redis-wait-timeout", c.RedisWaitTimeout, "the bound of each WAIT of --redis-wait-replicas; 0: the store's default (1s)")
	fs.StringVar(&c.KafkaBrokers, "kafka-brokers", c.KafkaBrokers, "comma-separated Kafka brokers for --broker=kafka [$ONCEMILL_KAFKA_BROKERS]")
	fs.StringVar(&c.AMQPURL, "amqp-url", c.AMQPURL, "RabbitMQ for --broker=amqp [$ONCEMILL_AMQP_URL]")
	fs.StringVar(&c.SQSEndpoint, "sqs-endpoint", c.SQSEndpoint, "SQS endpoint for --broker=sqs (region us-east-1, static credentials) [$ONCEMILL_SQS_ENDPOINT]")
	fs.StringVar(&c.NATSURL, "nats-url", c.NATSURL, "NATS with JetStream for --broker=nats [$ONCEMILL_NATS_URL]")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", c.OTLPEndpoint, "OTLP/HTTP endpoint for traces, e.g. http://jaeger:4318; empty: none [$ONCEMILL_OTLP_ENDPOINT]")
	fs.StringVar(&c.TopicPrefix, "topic-prefix", c.TopicPrefix, "prefix of every topic and queue: payments-<i>, settlements, dead-letters (run mode on a real broker: a fresh one per run unless set) [$ONCEMILL_TOPIC_PREFIX]")
	fs.StringVar(&c.ConsumerGroup, "consumer-group", c.ConsumerGroup, "Kafka consumer group (NATS: durable consumer); each topic is consumed by <group>-<topic> [$ONCEMILL_CONSUMER_GROUP]")
	fs.StringVar(&c.Scope, "scope", c.Scope, "oncemill scope (key space) and ledger scope (run mode on a shared store: a fresh one per run) [$ONCEMILL_SCOPE]")
	fs.StringVar(&c.PGSchema, "postgres-schema", c.PGSchema, "schema of the records and ledger tables [$ONCEMILL_POSTGRES_SCHEMA]")
	fs.StringVar(&c.RedisPrefix, "redis-prefix", c.RedisPrefix, "prefix of the records and ledger keys [$ONCEMILL_REDIS_PREFIX]")
	fs.IntVar(&c.KafkaPartitions, "kafka-partitions", c.KafkaPartitions, "partitions of each Kafka topic the worker creates")
	fs.BoolVar(&c.KafkaWatermark, "kafka-watermark", c.KafkaWatermark, "with --broker=kafka --store=postgres: the watermark mode, one row per consumer group, topic and partition instead of a record per message; the key is the message's offset, so --key has no effect and a command published twice runs twice")
	fs.DurationVar(&c.KafkaSessionTimeout, "kafka-session-timeout", c.KafkaSessionTimeout, "Kafka consumer group session timeout: how long a crashed worker's partitions wait before another takes them (below 30s)")
	fs.DurationVar(&c.SQSVisibilityTimeout, "sqs-visibility-timeout", c.SQSVisibilityTimeout, "VisibilityTimeout of the SQS queues the worker creates: when a nacked or unacked message comes back (whole seconds)")
	fs.IntVar(&c.SQSWorkers, "sqs-workers", c.SQSWorkers, "concurrent receivers per SQS queue")
	fs.DurationVar(&c.NATSAckWait, "nats-ack-wait", c.NATSAckWait, "AckWait of the JetStream consumers: when an unacked delivery (a crash, a slow handler) comes back; above the longest attempt pause plus the handler")
	fs.IntVar(&c.NATSMaxDeliver, "nats-max-deliver", c.NATSMaxDeliver, "MaxDeliver of the JetStream consumers: deliveries of a message before JetStream stops delivering it; -1: no cap")
	fs.IntVar(&c.NATSMaxAckPending, "nats-max-ack-pending", c.NATSMaxAckPending, "MaxAckPending of the JetStream consumers: deliveries of one consumer waiting for their ack at once, across its workers")
	fs.StringVar(&c.HTTPAddr, "http-addr", c.HTTPAddr, "address of /metrics, /healthz and /readyz; empty: off (consume mode: :8080 unless set) [$ONCEMILL_HTTP_ADDR]")
	fs.DurationVar(&c.DrainTimeout, "drain-timeout", c.DrainTimeout, "on SIGTERM, how long to wait for messages in flight before exiting")
}

// ApplyModeDefaults adapts defaults where the flag was not set (set names
// the flags that were). A run on gochannel with a shared store keeps at
// most 32 deliveries in flight: gochannel hands every published message to
// a handler at once, and thousands of handlers queueing for the store's
// connections would stall heartbeats past the lease (and, in PostgreSQL's
// one-transaction mode, each handler holds a pooled connection). The
// deployable worker (consume mode) logs at info in JSON, reports progress
// every 10s and serves its HTTP endpoints on :8080.
func (c *Config) ApplyModeDefaults(set map[string]bool) {
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
	if !set["progress"] {
		c.Progress = 10 * time.Second
	}
	if !set["http-addr"] && c.HTTPAddr == "" {
		c.HTTPAddr = ":8080"
	}
}

// ParseFlags parses args (without the program name) on fs, where the
// caller has registered its flags, applies the mode defaults to c and
// validates it.
func (c *Config) ParseFlags(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.ApplyModeDefaults(set)
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q: %s takes flags only", fs.Arg(0), fs.Name())
	}
	return c.Validate()
}

// Validate reports the first setting that cannot work, naming its flag.
func (c Config) Validate() error {
	switch {
	case c.Count < 1:
		return fmt.Errorf("--count=%d: publish at least one command", c.Count)
	case c.Partitions < 1:
		return fmt.Errorf("--partitions=%d: run at least one partition", c.Partitions)
	case c.Lease <= 0:
		return fmt.Errorf("--lease=%v: must be above zero", c.Lease)
	case c.Timeout <= 0:
		return fmt.Errorf("--timeout=%v: must be above zero", c.Timeout)
	case c.Progress < 0:
		return fmt.Errorf("--progress=%v: use 0 to turn progress off", c.Progress)
	case c.InFlight < 2:
		return fmt.Errorf("--inflight=%d: allow at least 2 deliveries in flight (a concurrent duplicate is two)", c.InFlight)
	case c.KafkaPartitions < 1:
		return fmt.Errorf("--kafka-partitions=%d: create at least one partition", c.KafkaPartitions)
	case c.KafkaSessionTimeout <= 0:
		return fmt.Errorf("--kafka-session-timeout=%v: must be above zero", c.KafkaSessionTimeout)
	case c.KafkaSessionTimeout >= 30*time.Second:
		return fmt.Errorf("--kafka-session-timeout=%v: must be below 30s: it is also the rebalance timeout, and sarama's network read timeout is set 5s above it", c.KafkaSessionTimeout)
	case c.SQSVisibilityTimeout < time.Second || c.SQSVisibilityTimeout%time.Second != 0:
		return fmt.Errorf("--sqs-visibility-timeout=%v: SQS takes whole seconds, at least 1s", c.SQSVisibilityTimeout)
	case c.SQSWorkers < 1:
		return fmt.Errorf("--sqs-workers=%d: run at least one receiver", c.SQSWorkers)
	case c.NATSAckWait < time.Second:
		return fmt.Errorf("--nats-ack-wait=%v: at least 1s, above the longest attempt pause plus the handler", c.NATSAckWait)
	case c.NATSMaxDeliver == 0 || c.NATSMaxDeliver < -1:
		return fmt.Errorf("--nats-max-deliver=%d: a positive cap, or -1 for none", c.NATSMaxDeliver)
	case c.NATSMaxAckPending < 1:
		return fmt.Errorf("--nats-max-ack-pending=%d: allow at least one delivery in flight", c.NATSMaxAckPending)
	case c.RedisWaitReplicas < 0:
		return fmt.Errorf("--redis-wait-replicas=%d: use 0 for no WAIT", c.RedisWaitReplicas)
	case c.RedisSentinel != "" && c.RedisMaster == "":
		return errors.New("--redis-master is empty: name the primary that --redis-sentinel monitors")
	case c.DrainTimeout <= 0:
		return fmt.Errorf("--drain-timeout=%v: must be above zero", c.DrainTimeout)
	case c.Scope == "":
		return errors.New("--scope is empty: name the key space")
	}
	for _, f := range []struct {
		flag, v string
		allowed []string
	}{
		{"log-level", c.LogLevel, logLevels},
		{"log-format", c.LogFormat, logFormats},
		{"broker", c.Broker, brokerNames},
		{"store", c.Store, storeNames},
		{"ledger", c.Ledger, ledgerNames},
		{"mode", c.Mode, modeNames},
		{"key", c.Key, keyKinds},
	} {
		if err := OneOf(f.flag, f.v, f.allowed); err != nil {
			return err
		}
	}
	switch {
	case c.Ledger == "postgres" && (c.Store == "postgres" || c.Store == "tiered"):
		return fmt.Errorf("--ledger=postgres with --store=%s: the store books its ledger in PostgreSQL already, in the record's transaction; use --ledger=store", c.Store)
	case c.KafkaWatermark && (c.Broker != "kafka" || c.Store != "postgres"):
		return fmt.Errorf("--kafka-watermark with --broker=%s --store=%s: the watermark mode needs --broker=kafka and --store=postgres", c.Broker, c.Store)
	case c.Mode == "consume" && c.Broker == "gochannel":
		return errors.New("--mode=consume with --broker=gochannel: gochannel lives in one process, so nothing could reach this worker; choose kafka, amqp, sqs or nats")
	case c.Mode == "produce" && c.Broker == "gochannel":
		return errors.New("--mode=produce with --broker=gochannel: gochannel lives in one process, so no worker could read what is produced; choose kafka, amqp, sqs or nats")
	}
	return nil
}

// OneOf reports an error naming flag unless v is one of allowed.
func OneOf(flag, v string, allowed []string) error {
	for _, a := range allowed {
		if v == a {
			return nil
		}
	}
	return fmt.Errorf("--%s=%q is not available; choose one of: %s", flag, v, strings.Join(allowed, ", "))
}

// NATS is the JetStream consumers' settings of c.
func (c Config) NATS() NATSSettings {
	return NATSSettings{URL: c.NATSURL, AckWait: c.NATSAckWait, MaxDeliver: c.NATSMaxDeliver, MaxAckPending: c.NATSMaxAckPending}
}
