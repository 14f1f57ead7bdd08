package main

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// The produce mode marks each command with its gateway fault, and a
// consumer's gateway injects it: a transient command fails its first call
// only, a stalled one takes the stall.
func TestProducedFaultsAreInjectedByTheConsumer(t *testing.T) {
	w := newWorkload(200, 1, 4, rates{Transient: 0.1, Stall: 0.05})
	w.markFaults()
	gw := newGateway(nil, 50*time.Millisecond, 0, 0)
	var calls int
	h := gw.middleware(func(*message.Message) ([]*message.Message, error) { calls++; return nil, nil })

	deliver := func(i int) (time.Duration, error) {
		payload, err := json.Marshal(w.Envelope(i, w.Commands[i]))
		if err != nil {
			t.Fatal(err)
		}
		msg := message.NewMessage(watermill.NewUUID(), payload)
		msg.SetContext(context.Background())
		start := time.Now()
		_, err = h(msg)
		return time.Since(start), err
	}
	var transient, stall int
	for i, f := range w.faults {
		switch {
		case f.transient:
			transient++
			if _, err := deliver(i); !errors.Is(err, errGatewayTimeout) {
				t.Fatalf("command %d marked transient: first call %v, want the gateway timeout", i, err)
			}
			if _, err := deliver(i); err != nil {
				t.Fatalf("command %d marked transient: second call %v, want success", i, err)
			}
		case f.stall:
			stall++
			if took, err := deliver(i); err != nil || took < 50*time.Millisecond {
				t.Fatalf("command %d marked stall: %v after %v, want success after the 50ms stall", i, err, took)
			}
		}
	}
	if transient != 20 || stall != 10 {
		t.Fatalf("%d transient and %d stalled commands, want 20 and 10", transient, stall)
	}
	if calls != transient+stall {
		t.Errorf("the handler ran %d times, want %d: once per command after its fault", calls, transient+stall)
	}
}

func TestWorkloadFaults(t *testing.T) {
	r := defaultConfig().Rates
	w := newWorkload(10000, 1, 8, r)
	c := w.counts
	if c.invalid != 200 || c.transient != 500 || c.stall != 10 || c.redeliver != 2000 || c.resend != 1000 {
		t.Errorf("fault counts %+v do not follow the rates of 10000 commands", c)
	}
	if c.concurrent < 500 {
		t.Errorf("concurrent=%d, want at least 500 (and the stalled commands)", c.concurrent)
	}
	if w.deliveries != len(w.Steps)+c.concurrent {
		t.Errorf("deliveries=%d, want the %d steps and %d concurrent copies", w.deliveries, len(w.Steps), c.concurrent)
	}
	for i, f := range w.faults {
		if n := btoi(w.Invalid[i]) + btoi(f.transient) + btoi(f.stall); n > 1 {
			t.Errorf("command %d has %d handler faults", i, n)
		}
		if f.stall && !f.concurrent {
			t.Errorf("stalled command %d is not also sent concurrently", i)
		}
		if home := w.Partition(i, 8); f.concurrent && w.partnerOf(i, home) == home {
			t.Errorf("command %d: the concurrent copy goes to its own partition", i)
		}
	}
	// A rate above zero always selects a command.
	if got := newWorkload(10, 1, 8, r).counts.stall; got != 1 {
		t.Errorf("stall=%v of 10 commands selected %d, want 1", r.Stall, got)
	}
}

func TestRatesValidate(t *testing.T) {
	for _, tt := range []struct {
		r          rates
		partitions int
		want       string
	}{
		{rates{Concurrent: 1.5}, 8, "--concurrent=1.5: a rate is a fraction of the commands, in [0,1]"},
		{rates{Concurrent: 0.1}, 1, "need at least 2 partitions"},
		{rates{Transient: 0.6, Stall: 0.5}, 8, "add up to at most 1"},
	} {
		if err := tt.r.validate(tt.partitions); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%+v on %d partitions: %v, want an error containing %q", tt.r, tt.partitions, err, tt.want)
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
