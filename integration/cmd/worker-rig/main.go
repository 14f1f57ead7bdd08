// Command worker-rig is the integration tests' worker: the payments worker
// of integration/internal/worker (the same handler, wiring, brokers and
// stores the soak tool runs) with every flag the tests set, and no faults.
// It is a rig, not the example: the code a user copies is
// cmd/example-worker, a slimmer worker with the same handler.
//
// It has three modes (--mode):
//
//   - run (default): producer and consumer in one process: it publishes
//     payment commands with the duplicates of at-least-once delivery and
//     some invalid amounts, waits until every delivery is acknowledged, and
//     counts the ledger. Its last line on stdout is
//
//     summary: published=N deliveries=D unique=U effects=E replays=R cached_failures=F double_effects=X lost=L msgs_per_sec=S
//
//     It exits 0 only when the run completed with double_effects=0 and
//     lost=0, 1 when a check failed or the run did not complete, 2 on bad
//     flags.
//
//   - produce: publishes the workload to the broker and exits.
//
//   - consume: consumes until SIGTERM or SIGINT, logging progress, then
//     drains the messages in flight (--drain-timeout) and exits. It serves
//     /metrics, /healthz and /readyz on --http-addr and logs JSON.
//
// Addresses come from flags or from ONCEMILL_* environment variables (-h).
// integration/cmd/oncemill-soak runs the same worker with faults injected.
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

	"github.com/oncemill/oncemill/integration/internal/worker"
)

func main() {
	os.Exit(realMain(os.Args[1:], os.Stdout, os.Stderr))
}

// parseFlags parses args (without the program name) into a validated config.
func parseFlags(args []string, output io.Writer) (worker.Config, error) {
	cfg := worker.DefaultConfig()
	fs := flag.NewFlagSet("worker-rig", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprintf(output, "Usage: worker-rig [flags]\n\n"+
			"the integration tests' payments worker. Without flags it runs the demo: it\n"+
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
		fmt.Fprintf(stderr, "worker-rig: %v\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch cfg.Mode {
	case "produce":
		err = worker.Produce(ctx, cfg, demoPlan(cfg), worker.Hooks{}, stdout, stderr)
		return worker.ExitCode(stderr, "worker-rig", err)
	case "consume":
		return worker.ExitCode(stderr, "worker-rig", worker.Consume(ctx, cfg, worker.Hooks{}, stdout, stderr))
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
	return worker.ExitCode(stderr, "worker-rig", err, problems...)
}
