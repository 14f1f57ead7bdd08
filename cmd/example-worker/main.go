// Command example-worker runs a payments workload through a Watermill router
// guarded by oncemill, injects the faults of at-least-once delivery, and
// checks the result: every valid payment took effect exactly once.
//
// With no flags it runs in process (gochannel and the memory store) and
// finishes on its own. Its last line on stdout is the summary:
//
//	summary: published=N deliveries=D unique=U effects=E replays=R cached_failures=F double_effects=X lost=L msgs_per_sec=S
//
// It exits 0 only when the run completed with double_effects=0 and lost=0,
// 1 when a check failed or the run did not complete, 2 on bad flags.
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
	Broker        string
	Store         string
	NoIdempotency bool // run the handler without oncemill (negative control)
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
		Broker:     "gochannel",
		Store:      "memory",
	}
}

// Names accepted by --broker, --store and --log-level. Real brokers and stores
// are added in wiring.go and listed here.
var (
	brokers   = []string{"gochannel"}
	stores    = []string{"memory"}
	logLevels = []string{"off", "error", "info", "debug", "trace"}
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

	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
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
	case c.Partitions < 2 && (c.Concurrent > 0 || c.Stall > 0):
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
	if err := oneOf("broker", c.Broker, brokers); err != nil {
		return err
	}
	return oneOf("store", c.Store, stores)
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

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

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
