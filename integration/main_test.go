package integration

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// env is what TestMain set up: the services' addresses and the worker
// binaries: the worker rig (the payments worker of internal/worker with every
// flag the tests set), and the soak tool (the same worker with fault
// injection and test switches).
var env struct {
	workerBin   string // integration/cmd/worker-rig
	soakBin     string // integration/cmd/oncemill-soak
	postgresDSN string
	redisAddr   string
	amqpURL     string
	kafkaAddr   string
	sqsEndpoint string
	natsURL     string
}

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

func runTests(m *testing.M) int {
	flag.Parse()
	// The scenarios mostly wait on brokers and child processes, not on the
	// CPU: run more of them at once than GOMAXPROCS unless told otherwise.
	if !flagSet("test.parallel") {
		_ = flag.Set("test.parallel", "12")
	}
	env.postgresDSN = getenv("ONCEMILL_POSTGRES_DSN", "postgres://postgres@127.0.0.1:5432/test")
	env.redisAddr = getenv("ONCEMILL_REDIS_ADDR", "127.0.0.1:6379")
	env.amqpURL = getenv("ONCEMILL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/")
	env.natsURL = getenv("ONCEMILL_NATS_URL", "nats://127.0.0.1:4222")

	if err := checkServices(); err != nil {
		fmt.Fprintf(os.Stderr, "integration: FAIL: %v\n", err)
		return 1
	}

	dir, err := os.MkdirTemp("", "oncemill-integration-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: FAIL: %v\n", err)
		return 1
	}
	defer os.RemoveAll(dir)

	start := time.Now()
	env.workerBin = filepath.Join(dir, "worker-rig")
	env.soakBin = filepath.Join(dir, "oncemill-soak")
	build := exec.Command("go", "build", "-o", dir, "./cmd/worker-rig", "./cmd/oncemill-soak")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "integration: FAIL: building the worker rig and the soak tool: %v\n", err)
		return 1
	}

	kafka, err := startKafka()
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: FAIL: %v\n", err)
		return 1
	}
	defer kafka.Close()
	env.kafkaAddr = kafka.ListenAddrs()[0]

	sqs, err := startSQS(dir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "integration: FAIL: %v\n", err)
		return 1
	}
	defer sqs.stop()
	env.sqsEndpoint = sqs.endpoint

	fmt.Fprintf(os.Stderr, "integration: postgres %s, redis %s, rabbitmq %s, nats %s, kafka (kfake) %s, sqs (%s) %s; set up in %v\n",
		redact(env.postgresDSN), env.redisAddr, redact(env.amqpURL), redact(env.natsURL), env.kafkaAddr, sqs.origin, env.sqsEndpoint, time.Since(start).Round(time.Millisecond))
	return m.Run()
}

func getenv(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
