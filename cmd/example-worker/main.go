// Command example-worker is oncemill's example: a payments worker on
// Watermill whose handler charges each payment once, however often the
// broker delivers the command.
//
// Read it in this order; each file is meant to be copied:
//
//   - worker/handler.go: the payment handler, a plain Watermill handler.
//   - worker/wiring.go: oncemill's receiver around it, and the router.
//   - worker/consume.go: the deployable worker: progress, /metrics,
//     /healthz, /readyz, and the drain on SIGTERM.
//   - worker/brokers.go (kafka.go, amqp.go, sqs.go) and worker/stores.go
//     (ledger_postgres.go for the one-transaction mode): the broker and the
//     store.
//
// It has three modes (--mode):
//
//   - run (default): the demo. Producer and consumer in one process: it
//     publishes payment commands with the duplicates of at-least-once
//     delivery (redeliveries, re-sends under a new UUID) and some invalid
//     amounts, waits until every delivery is acknowledged, and counts the
//     ledger. With no flags it runs on gochannel and the memory store and
//     needs no service. Its last line on stdout is
//
//     summary: published=N deliveries=D unique=U effects=E replays=R cached_failures=F double_effects=X lost=L msgs_per_sec=S
//
//     It exits 0 only when the run completed with double_effects=0 and
//     lost=0, 1 when a check failed or the run did not complete, 2 on bad
//     flags.
//
//   - produce: publishes the demo workload to the broker and exits.
//
//   - consume: the deployable worker. It consumes until SIGTERM or SIGINT,
//     logging progress, then drains the messages in flight
//     (--drain-timeout) and exits. It serves /metrics (Prometheus), /healthz
//     and /readyz on --http-addr and logs JSON.
//
// Addresses come from flags or from ONCEMILL_* environment variables (see
// -h and docs/docker.md). cmd/oncemill-soak runs the same worker with faults
// injected, to test oncemill.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/oncemill/oncemill/cmd/example-worker/worker"
)

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// parseFlags parses args (without the program name) into a validated config.
func parseFlags(args []string, output io.Writer) (worker.Config, error) {
	cfg := worker.DefaultConfig()
	fs := flag.NewFlagSet("example-worker", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprintf(output, "Usage: example-worker [flags]\n\n"+
			"oncemill's example payments worker. Without flags it runs the demo: it\n"+
			"publishes payment commands with duplicates to itself (gochannel, memory\n"+
			"store), checks that every valid payment took effect exactly once, and\n"+
			"ends with the summary line. --mode=consume is the deployable worker.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	cfg.RegisterFlags(fs)
	if err := cfg.ParseFlags(fs, args); err != nil {
		return worker.Config{}, err
	}
	return cfg, nil
}

// demoPlan is the demo workload: --count commands with duplicates.
func demoPlan(cfg worker.Config) *worker.Plan {
	return worker.NewPlan(cfg.Count, cfg.Seed, worker.DemoDuplicates)
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
		err = worker.Produce(ctx, cfg, demoPlan(cfg), worker.Hooks{}, stdout, stderr)
		return worker.ExitCode(stderr, "example-worker", err)
	case "consume":
		return worker.ExitCode(stderr, "example-worker", worker.Consume(ctx, cfg, worker.Hooks{}, stdout, stderr))
	}

	plan := demoPlan(cfg)
	sum, err := worker.Run(ctx, cfg, plan, stderr)
	var problems []string
	if sum != nil {
		fmt.Fprintf(stdout, "duplicates: redelivered=%d resent_new_uuid=%d invalid_amount=%d; elapsed %v\n",
			plan.Redelivered, plan.Resent, plan.Invalids, sum.Elapsed.Round(time.Millisecond))
		fmt.Fprintln(stdout, sum.Line())
		problems = sum.Problems()
	}
	return worker.ExitCode(stderr, "example-worker", err, problems...)
}
