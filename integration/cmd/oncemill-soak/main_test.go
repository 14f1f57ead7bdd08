package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oncemill/oncemill/pipeline"
)

var summaryLine = regexp.MustCompile(`^summary: published=\d+ deliveries=\d+ unique=\d+ effects=\d+ replays=\d+ cached_failures=\d+ double_effects=\d+ lost=\d+ msgs_per_sec=\d+$`)

// testConfig is the default workload, smaller, with every fault enabled and
// a short lease so the stalls are cheap.
func testConfig() config {
	cfg := defaultConfig()
	cfg.Count = 1500
	cfg.Lease = 500 * time.Millisecond
	cfg.Progress = 0
	cfg.Timeout = time.Minute
	return cfg
}

func runWorkload(t *testing.T, cfg config) (*summary, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	sum, err := run(context.Background(), cfg, &stdout, &stderr)
	if err != nil {
		t.Fatalf("run: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	return sum, stdout.String()
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func TestWorkloadIsExactlyOnceWithOncemill(t *testing.T) {
	cfg := testConfig()
	r := cfg.Rates
	for _, rate := range []float64{r.Redeliver, r.Resend, r.Concurrent, r.Transient, r.Invalid, r.Stall} {
		if rate <= 0 {
			t.Fatalf("every fault must be enabled, got %+v", r)
		}
	}
	sum, out := runWorkload(t, cfg)
	t.Logf("\n%s", out)
	invalid, o := sum.Invalid, sum.Outcomes

	if !sum.Completed {
		t.Fatal("run did not complete")
	}
	if sum.DoubleEffects != 0 || sum.Lost != 0 {
		t.Errorf("double_effects=%d lost=%d, want 0 and 0", sum.DoubleEffects, sum.Lost)
	}
	if sum.Published != cfg.Count || sum.Unique != cfg.Count {
		t.Errorf("published=%d unique=%d, want %d each", sum.Published, sum.Unique, cfg.Count)
	}
	if invalid == 0 {
		t.Fatal("the plan has no invalid commands")
	}
	if want := cfg.Count - invalid; sum.Effects != want {
		t.Errorf("effects=%d, want count-permanent = %d", sum.Effects, want)
	}
	if sum.Deliveries <= cfg.Count || sum.Deliveries != sum.Planned {
		t.Errorf("deliveries=%d, want all %d planned (more than %d commands)", sum.Deliveries, sum.Planned, cfg.Count)
	}
	if sum.Replays == 0 {
		t.Error("replays=0: no duplicate was answered from a stored success")
	}
	if sum.CachedFailures == 0 || o[pipeline.OutcomeCachedFailureReplayed] == 0 {
		t.Errorf("cached_failures=%d cached_failure_replayed=%d: want both above 0", sum.CachedFailures, o[pipeline.OutcomeCachedFailureReplayed])
	}
	if got := o[pipeline.OutcomeCachedFailure]; got != int64(invalid) {
		t.Errorf("cached_failure=%d, want one per invalid command (%d)", got, invalid)
	}
	if o[pipeline.OutcomeReleased] == 0 {
		t.Error("released=0: no transient failure was retried")
	}
	if sum.ContendedKeys == 0 {
		t.Error("contended_keys=0: no duplicate met a running delivery")
	}
	// Takeovers are not asserted: on a starved machine a pause of the whole
	// process can outlast a lease; the lease check before the charge keeps
	// that from becoming a double effect, which is what is asserted.
	if o[pipeline.OutcomeRejected] != 0 {
		t.Errorf("rejected=%d, want 0: no command may be refused", o[pipeline.OutcomeRejected])
	}
	if sum.SettledUUIDs != sum.Effects || sum.Settled != sum.Effects+int(sum.Replays) {
		t.Errorf("settlements received=%d distinct=%d, want %d distinct (one per effect) and %d in all (replays re-publish them)",
			sum.Settled, sum.SettledUUIDs, sum.Effects, sum.Effects+int(sum.Replays))
	}
	if p := sum.problems(); len(p) != 0 {
		t.Errorf("problems: %q", p)
	}
	if line := lastLine(out); !summaryLine.MatchString(line) || line != sum.Line() {
		t.Errorf("last stdout line %q does not match %v", line, summaryLine)
	}
}

// The negative control: the same workload without oncemill must show double
// effects, or the check above proves nothing.
func TestWorkloadWithoutIdempotencyHasDoubleEffects(t *testing.T) {
	cfg := testConfig()
	cfg.NoIdempotency = true
	sum, out := runWorkload(t, cfg)
	t.Logf("\n%s", out)

	if sum.DoubleEffects == 0 {
		t.Error("double_effects=0 without idempotency: the check cannot fail")
	}
	if sum.Lost != 0 {
		t.Errorf("lost=%d, want 0 (every delivery runs)", sum.Lost)
	}
	if len(sum.problems()) == 0 {
		t.Error("problems() is empty for a run with double effects")
	}
	if line := lastLine(out); !summaryLine.MatchString(line) {
		t.Errorf("last stdout line %q does not match %v", line, summaryLine)
	}
}

func TestExitCodes(t *testing.T) {
	small := []string{"--count=200", "--lease=300ms", "--progress=0"}
	tests := []struct {
		name string
		args []string
		want int
	}{
		{"a run with the receiver passes", small, 0},
		{"run without oncemill fails", append(small, "--no-idempotency"), 1},
		{"bad flag", []string{"--redeliver=2"}, 2},
		{"help", []string{"-h"}, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			if got := realMain(tt.args, &stdout, &stderr); got != tt.want {
				t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", got, tt.want, stdout.String(), stderr.String())
			}
			if tt.want == 1 && !strings.Contains(stderr.String(), "FAIL: double_effects=") {
				t.Errorf("stderr does not say why the run failed:\n%s", stderr.String())
			}
		})
	}
}

func TestTimeoutReportsWhatIsOutstanding(t *testing.T) {
	cfg := testConfig()
	cfg.Count = 200
	cfg.Rates.Stall = 0.05 // ten commands stall 1.5x the lease, far past the timeout
	cfg.Timeout = 100 * time.Millisecond
	var stdout bytes.Buffer
	sum, err := run(context.Background(), cfg, &stdout, io.Discard)
	if err == nil {
		t.Fatalf("run completed within %v despite stalls of %v", cfg.Timeout, cfg.Lease*3/2)
	}
	if sum == nil || sum.Completed || !strings.Contains(err.Error(), "timed out") || !strings.Contains(err.Error(), "outstanding") {
		t.Errorf("summary %v, err=%v: want an incomplete run and an error naming what is outstanding", sum, err)
	}
	if line := lastLine(stdout.String()); !summaryLine.MatchString(line) {
		t.Errorf("last stdout line %q does not match %v", line, summaryLine)
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatalf("defaults: %v", err)
	}
	if cfg != defaultConfig() {
		t.Errorf("no flags gave %+v, want the defaults", cfg)
	}
	cfg, err = parseFlags([]string{"--count=7", "--partitions=3", "--stall=0", "--no-idempotency", "--lease=2s", "--hold-before-ack=p-1", "--key=uuid"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Count != 7 || cfg.Partitions != 3 || cfg.Rates.Stall != 0 || !cfg.NoIdempotency || cfg.Lease != 2*time.Second || cfg.HoldBeforeAck != "p-1" || cfg.Key != "uuid" {
		t.Errorf("flags not applied: %+v", cfg)
	}

	bad := []struct {
		args []string
		want string
	}{
		{[]string{"--redeliver=1.5"}, "--redeliver=1.5: a rate is a fraction of the commands, in [0,1]"},
		{[]string{"--permanent=-0.1"}, "--permanent=-0.1"},
		{[]string{"--stall=NaN"}, "--stall=NaN"},
		{[]string{"--transient=0.6", "--permanent=0.5"}, "add up to at most 1"},
		{[]string{"--count=0"}, "--count=0"},
		{[]string{"--partitions=1"}, "need at least 2 partitions"},
		{[]string{"--lease=0s"}, "--lease=0s"},
		{[]string{"--timeout=-1s"}, "--timeout=-1s"},
		{[]string{"--inflight=1"}, "--inflight=1"},
		{[]string{"--overlap=-1ms"}, "--overlap=-1ms"},
		{[]string{"--gateway-latency=-1ms"}, "--gateway-latency=-1ms"},
		{[]string{"--broker=pulsar"}, `--broker="pulsar" is not available; choose one of: gochannel, kafka, amqp, sqs, nats`},
		{[]string{"--mode=consume"}, "--mode=consume with --broker=gochannel"},
		{[]string{"--amqp-client=v1"}, `--amqp-client="v1"`},
		{[]string{"--key=offset"}, `--key="offset"`},
		{[]string{"extra"}, `unexpected argument "extra"`},
	}
	for _, tt := range bad {
		_, err := parseFlags(tt.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("parseFlags(%q) = %v, want an error containing %q", tt.args, err, tt.want)
		}
	}

	// One partition is fine when nothing needs a second, and in consume mode.
	if _, err := parseFlags([]string{"--partitions=1", "--concurrent=0", "--stall=0"}, io.Discard); err != nil {
		t.Errorf("one partition without concurrent duplicates: %v", err)
	}
	if _, err := parseFlags([]string{"--partitions=1", "--mode=consume", "--broker=kafka"}, io.Discard); err != nil {
		t.Errorf("one partition in consume mode: %v", err)
	}
}
