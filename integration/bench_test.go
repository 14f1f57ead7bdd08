package integration

import (
	"bytes"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
)

// BenchmarkWorkerThroughput runs the soak tool's self-contained workload
// (the example worker, producer and consumer in one process) on each broker
// and store, with oncemill and without it (--no-idempotency), back to back
// in one run, and reports the delivered messages per second of each.
//
//	go test ./integration/ -run '^$' -bench WorkerThroughput -benchtime=1x
//
// The workload has duplicates (20% redelivered, 10% re-sent under a new
// UUID) and 2% invalid commands, but no stalls, transient errors or
// concurrent copies, which would measure the broker's redelivery delays
// instead. Without oncemill the duplicates take effect twice (that is the
// baseline's point, and why its exit code is ignored here). Kafka is kfake
// in the test process, and the SQS emulator is a Node.js process: the
// figures compare oncemill with its baseline on one machine, not the brokers.
//
// With -short (scripts/test) each run sends a twentieth of the commands: a check
// that it runs, not a figure.
func BenchmarkWorkerThroughput(b *testing.B) {
	counts := map[string]int{"kafka": 4000, "amqp": 4000, "sqs": 1000}
	if testing.Short() {
		for broker := range counts {
			counts[broker] /= 20
		}
	}
	brokers := map[string][]string{
		"kafka": {"--broker=kafka", "--kafka-brokers=" + env.kafkaAddr},
		"amqp":  {"--broker=amqp", "--amqp-url=" + env.amqpURL},
		"sqs":   {"--broker=sqs", "--sqs-endpoint=" + env.sqsEndpoint, "--sqs-visibility-timeout=5s"},
	}
	stores := map[string][]string{
		"postgres": {"--store=postgres", "--postgres-dsn=" + env.postgresDSN, "--postgres-schema=oncemill_bench"},
		"redis":    {"--store=redis", "--redis-addr=" + env.redisAddr, "--redis-prefix=oncemill_bench"},
	}
	for _, broker := range []string{"kafka", "amqp", "sqs"} {
		for _, st := range []string{"postgres", "redis"} {
			for _, mode := range []string{"oncemill", "baseline"} {
				b.Run(broker+"/"+st+"/"+mode, func(b *testing.B) {
					args := append(append([]string{
						"--count=" + strconv.Itoa(counts[broker]), "--partitions=8", "--progress=0", "--timeout=5m",
						"--stall=0", "--transient=0", "--concurrent=0", "--overlap=0",
					}, brokers[broker]...), stores[st]...)
					if mode == "baseline" {
						args = append(args, "--no-idempotency")
					}
					var total float64
					for range b.N {
						total += runThroughput(b, args)
					}
					b.ReportMetric(total/float64(b.N), "msgs/s")
					b.ReportMetric(0, "ns/op")
				})
			}
		}
	}
}

var msgsPerSec = regexp.MustCompile(`(?m)^summary: .* deliveries=(\d+) .* msgs_per_sec=(\d+)$`)

// runThroughput runs the soak tool once and returns its msgs_per_sec.
func runThroughput(b *testing.B, args []string) float64 {
	b.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(env.soakBin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	_ = cmd.Run() // the baseline exits 1: its duplicates took effect twice
	m := msgsPerSec.FindStringSubmatch(stdout.String())
	if m == nil {
		b.Fatalf("no summary line from %v:\n%s\n%s", args, stdout.String(), stderr.String())
	}
	if !bytes.Contains(stdout.Bytes(), []byte("completed=true")) {
		b.Fatalf("the run did not complete:\n%s\n%s", stdout.String(), stderr.String())
	}
	v, err := strconv.ParseFloat(m[2], 64)
	if err != nil {
		b.Fatal(err)
	}
	return v
}
