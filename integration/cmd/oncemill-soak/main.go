// Command oncemill-soak tests oncemill beyond the example worker's demo. It
// runs the integration tests' payments worker (integration/internal/worker:
// the example worker's handler, with brokers, stores and a ledger the tests
// can count) with the faults of at-least-once delivery injected, and checks
// that every valid payment took effect exactly once.
// The integration tests (integration/) run it as their worker process.
//
// On top of the example worker's flags it has:
//
//   - fault rates: --redeliver, --resend, --concurrent, --permanent (the
//     demo's duplicates, at rates of your choosing), --transient (the
//     gateway times out once) and --stall (the gateway stalls for 1.5x the
//     lease); --overlap and --gateway-latency slow the simulated gateway;
//     --seed and --inflight shape the workload; --key=uuid keys by message
//     UUID instead of content. In produce mode each command carries its
//     gateway fault, which a consumer of this tool injects.
//   - --no-idempotency: the handler without oncemill, the negative control
//     (it must show double effects) and the throughput baseline.
//   - --hold-before-ack=<payment_id>: in consume mode, after that payment's
//     effect and oncemill's record are written, print a "hold:" line and
//     never ack, so that a test can kill the process there.
//   - --amqp-client=v2: watermill-amqp/v2 instead of /v3.
//
// Its run mode prints what the run saw (faults, outcomes, settlements)
// before the example worker's summary line, and also fails when oncemill's
// events disagree with what the router acknowledged.
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

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/integration/internal/worker"
)

// config is the example worker's configuration and the faults.
type config struct {
	worker.Config
	Rates rates
	// Overlap is how long the gateway takes for a command delivered to two
	// partitions at once, so both copies are in handlers at the same time.
	Overlap        time.Duration
	GatewayLatency time.Duration // every simulated gateway call takes at least this long
	NoIdempotency  bool          // run the handler without oncemill (negative control)
	HoldBeforeAck  string        // consume mode: hold this payment_id between its effect and its ack
	AMQPClient     string        // watermill-amqp major version: v3 or v2
}

func defaultConfig() config {
	return config{
		Config: worker.DefaultConfig(),
		Rates: rates{
			Duplicates: worker.Duplicates{Redeliver: 0.2, Resend: 0.1, Invalid: 0.02},
			Concurrent: 0.05, Transient: 0.05, Stall: 0.001,
		},
		Overlap:    2 * time.Millisecond,
		AMQPClient: worker.Env("ONCEMILL_AMQP_CLIENT", "v3"),
	}
}

// parseFlags parses args (without the program name) into a validated config.
func parseFlags(args []string, output io.Writer) (config, error) {
	cfg := defaultConfig()
	fs := flag.NewFlagSet("oncemill-soak", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		fmt.Fprintf(output, "Usage: oncemill-soak [flags]\n\n"+
			"Runs the example worker with the faults of at-least-once delivery injected\n"+
			"and checks that every valid payment took effect exactly once. The last\n"+
			"stdout line of the run mode is the summary.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	cfg.RegisterFlags(fs)
	r := &cfg.Rates
	fs.Float64Var(&r.Redeliver, "redeliver", r.Redeliver, "fraction of commands delivered again later (same UUID and payload)")
	fs.Float64Var(&r.Resend, "resend", r.Resend, "fraction of commands re-sent later under a new UUID, sent_at and attempt")
	fs.Float64Var(&r.Concurrent, "concurrent", r.Concurrent, "fraction of commands published to two partitions at the same moment")
	fs.Float64Var(&r.Transient, "transient", r.Transient, "fraction of commands whose first gateway call times out (retried)")
	fs.Float64Var(&r.Invalid, "permanent", r.Invalid, "fraction of commands with an invalid amount (cached failure, no effect)")
	fs.Float64Var(&r.Stall, "stall", r.Stall, "fraction of commands whose gateway call stalls for 1.5x the lease")
	fs.DurationVar(&cfg.Overlap, "overlap", cfg.Overlap, "gateway latency for commands published to two partitions at once, so the copies meet (0: none)")
	fs.DurationVar(&cfg.GatewayLatency, "gateway-latency", cfg.GatewayLatency, "every simulated payment gateway call takes at least this long")
	fs.IntVar(&cfg.InFlight, "inflight", cfg.InFlight, "most deliveries published and not yet acknowledged")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "seed that picks the commands and their faults")
	fs.StringVar(&cfg.Key, "key", cfg.Key, "who a command is: content (its canonical JSON without meta.sent_at and meta.attempt, so a re-send under a new UUID is the same key) or uuid (the message UUID)")
	fs.BoolVar(&cfg.NoIdempotency, "no-idempotency", cfg.NoIdempotency, "run the handler without oncemill (a negative control, and a baseline for benchmarks)")
	fs.StringVar(&cfg.HoldBeforeAck, "hold-before-ack", cfg.HoldBeforeAck, "consume mode: after this payment_id's effect is recorded, print a hold: line and never ack it")
	fs.StringVar(&cfg.AMQPClient, "amqp-client", cfg.AMQPClient, "watermill-amqp major version for --broker=amqp: v3 or v2 [$ONCEMILL_AMQP_CLIENT]")

	if err := cfg.ParseFlags(fs, args); err != nil {
		return config{}, err
	}
	if err := cfg.validate(); err != nil {
		return config{}, err
	}
	return cfg, nil
}

// validate checks what the example worker's Config.Validate does not.
func (c config) validate() error {
	partitions := c.Partitions
	if c.Mode == "consume" {
		partitions = 2 // a consumer publishes nothing: the rates do not apply
	}
	if err := c.Rates.validate(partitions); err != nil {
		return err
	}
	switch {
	case c.Overlap < 0:
		return fmt.Errorf("--overlap=%v: use 0 for no added latency", c.Overlap)
	case c.GatewayLatency < 0:
		return fmt.Errorf("--gateway-latency=%v: use 0 for none", c.GatewayLatency)
	}
	return worker.OneOf("amqp-client", c.AMQPClient, []string{"v3", "v2"})
}

// workload is the plan of the run and produce modes, with its faults.
func (c config) workload() *workload {
	return newWorkload(c.Count, c.Seed, c.Partitions, c.Rates)
}

// hooks inject the faults into the example worker; w is nil in consume
// mode, where the commands carry their faults.
func (c config) hooks(w *workload, stdout io.Writer) worker.Hooks {
	gw := newGateway(w, c.Lease*3/2, c.Overlap, c.GatewayLatency)
	h := worker.Hooks{Inner: []message.HandlerMiddleware{gw.middleware}}
	if c.NoIdempotency {
		h.NewReceiver = withoutIdempotency
	}
	if c.Broker == "amqp" && c.AMQPClient == "v2" {
		h.Broker = newAMQPv2
	}
	if c.HoldBeforeAck != "" {
		h.Outer = append(h.Outer, holdBeforeAck(c.HoldBeforeAck, stdout))
	}
	return h
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
		fmt.Fprintf(stderr, "oncemill-soak: %v\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	switch cfg.Mode {
	case "produce":
		w := cfg.workload()
		w.markFaults()
		hooks := cfg.hooks(nil, stdout)
		hooks.Copies = w.copies(nil, 0) // no acks are seen here: copies go back to back
		return worker.ExitCode(stderr, "oncemill-soak", worker.Produce(ctx, cfg.Config, w.Plan, hooks, stdout, stderr))
	case "consume":
		return worker.ExitCode(stderr, "oncemill-soak", worker.Consume(ctx, cfg.Config, cfg.hooks(nil, stdout), stdout, stderr))
	}

	sum, err := run(ctx, cfg, stdout, stderr)
	var problems []string
	if sum != nil && (err == nil || sum.Deliveries > 0) {
		problems = sum.problems()
	}
	return worker.ExitCode(stderr, "oncemill-soak", err, problems...)
}
