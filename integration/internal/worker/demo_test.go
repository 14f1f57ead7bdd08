package worker

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/oncemill/oncemill/pipeline"
)

// The demo on gochannel and the memory store: every valid payment takes
// effect once, the duplicates are replayed and the invalid amounts cached.
func TestDemoRunIsExactlyOnce(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Count, cfg.Progress, cfg.Timeout = 1500, 0, time.Minute
	plan := NewPlan(cfg.Count, cfg.Seed, DemoDuplicates)
	var stderr bytes.Buffer
	sum, err := Run(context.Background(), cfg, plan, &stderr)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	if !sum.Completed || sum.DoubleEffects != 0 || sum.Lost != 0 || len(sum.Problems()) != 0 {
		t.Errorf("completed=%t double_effects=%d lost=%d problems %q", sum.Completed, sum.DoubleEffects, sum.Lost, sum.Problems())
	}
	if want := len(plan.Steps); sum.Published != cfg.Count || sum.Unique != cfg.Count || sum.Deliveries != want || want <= cfg.Count {
		t.Errorf("published=%d unique=%d deliveries=%d, want %d, %d and all %d planned", sum.Published, sum.Unique, sum.Deliveries, cfg.Count, cfg.Count, want)
	}
	if want := cfg.Count - plan.Invalids; plan.Invalids == 0 || sum.Effects != want {
		t.Errorf("effects=%d with %d invalid commands, want %d", sum.Effects, plan.Invalids, want)
	}
	if sum.Replays == 0 || sum.CachedFailures < int64(plan.Invalids) {
		t.Errorf("replays=%d cached_failures=%d: want replays, and every invalid command answered from the cache", sum.Replays, sum.CachedFailures)
	}
}

func TestPlan(t *testing.T) {
	p := NewPlan(10000, 1, DemoDuplicates)
	if p.Invalids != 200 || p.Redelivered != 2000 || p.Resent != 1000 || len(p.Steps) != 13000 || len(p.Others) != 9800 {
		t.Errorf("invalid=%d redelivered=%d resent=%d steps=%d others=%d do not follow the rates of 10000 commands",
			p.Invalids, p.Redelivered, p.Resent, len(p.Steps), len(p.Others))
	}
	seen := map[string]bool{}
	for i, c := range p.Commands {
		if p.Invalid[i] != (c.AmountCents <= 0) {
			t.Errorf("command %d: invalid=%t amount=%d", i, p.Invalid[i], c.AmountCents)
		}
		if seen[c.PaymentID] {
			t.Errorf("payment_id %s twice", c.PaymentID)
		}
		seen[c.PaymentID] = true
	}
	for _, i := range p.Others {
		if p.Invalid[i] {
			t.Errorf("command %d is invalid and among the others", i)
		}
	}
	// Every duplicate follows its original.
	first := map[int]int{}
	for at, s := range p.Steps {
		if s.Kind == SendOriginal {
			first[s.Cmd] = at
		} else if _, ok := first[s.Cmd]; !ok {
			t.Errorf("step %d: %v of command %d before its original", at, s.Kind, s.Cmd)
		}
	}
	// A rate above zero always selects a command.
	if got := NewPlan(10, 1, Duplicates{Invalid: 0.001}).Invalids; got != 1 {
		t.Errorf("invalid=0.001 of 10 commands selected %d, want 1", got)
	}
}

// An ack of a message acked as often as it was published (SQS after a
// visibility timeout) does not count: the run waits for the others.
func TestAcksIgnoreBrokerRedeliveries(t *testing.T) {
	a := newAcks()
	a.publishing(0, "a")
	a.publishing(0, "b")
	for _, uuid := range []string{"a", "a"} {
		a.record(eventOf(uuid))
	}
	if published, acked := a.state(); published != 2 || acked != 1 {
		t.Fatalf("published %d acked %d, want 2 and 1", published, acked)
	}
	a.record(eventOf("b"))
	if _, acked := a.state(); acked != 2 {
		t.Fatalf("acked %d, want 2", acked)
	}
}

func eventOf(uuid string) pipeline.Event {
	return pipeline.Event{MessageUUID: uuid, Outcome: pipeline.OutcomeExecuted}
}
