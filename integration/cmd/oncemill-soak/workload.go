package main

// The soak workload: the example worker's demo plan (commands,
// redeliveries, re-sends, invalid amounts) with the faults only a test
// injects: commands whose gateway call times out once (transient) or
// stalls past the lease (stall), and copies published to two partitions at
// the same moment (concurrent).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/oncemill/oncemill/integration/internal/worker"
)

// rates are fractions of the commands. A rate above zero always selects at
// least one command.
type rates struct {
	worker.Duplicates         // --redeliver, --resend, --permanent
	Concurrent        float64 // the same message on two partitions at once
	Transient         float64 // the gateway times out the first time
	Stall             float64 // the gateway stalls for 1.5x the lease
}

// validate reports the first rate that cannot work, naming its flag.
func (r rates) validate(partitions int) error {
	for _, x := range []struct {
		flag string
		v    float64
	}{
		{"redeliver", r.Redeliver}, {"resend", r.Resend}, {"concurrent", r.Concurrent},
		{"transient", r.Transient}, {"permanent", r.Invalid}, {"stall", r.Stall},
	} {
		if !(x.v >= 0 && x.v <= 1) { // also rejects NaN
			return fmt.Errorf("--%s=%v: a rate is a fraction of the commands, in [0,1]", x.flag, x.v)
		}
	}
	switch {
	case partitions < 2 && (r.Concurrent > 0 || r.Stall > 0):
		return fmt.Errorf("--partitions=%d: concurrent duplicates (--concurrent, and the duplicates of --stall) need at least 2 partitions", partitions)
	case r.Transient+r.Invalid+r.Stall > 1:
		return fmt.Errorf("--transient + --permanent + --stall = %v: each command has at most one of these faults, so they must add up to at most 1",
			r.Transient+r.Invalid+r.Stall)
	}
	return nil
}

// faults are what a test adds to one command. Transient and stall exclude
// each other and an invalid amount; a stalled command is also concurrent.
type faults struct {
	transient  bool // the gateway times out on the first call
	stall      bool // the gateway stalls for 1.5x the lease
	concurrent bool // the first send goes to a second partition at the same moment
}

// faultCounts are how many commands have each fault.
type faultCounts struct {
	invalid, transient, stall, redeliver, resend, concurrent int
}

// workload is the plan and its faults.
type workload struct {
	*worker.Plan
	faults     []faults
	counts     faultCounts
	deliveries int // publishes in all: the steps and the concurrent copies
	partitions int
}

func newWorkload(count int, seed uint64, partitions int, r rates) *workload {
	p := worker.NewPlan(count, seed, r.Duplicates)
	rng := rand.New(rand.NewPCG(seed, 0x736f616b))
	w := &workload{Plan: p, faults: make([]faults, count), partitions: partitions}
	// Handler faults go to valid commands, one each.
	others := p.Others
	take := func(rate float64) []int {
		k := min(worker.FaultCount(rate, count), len(others))
		picked := others[:k]
		others = others[k:]
		return picked
	}
	for _, i := range take(r.Transient) {
		w.faults[i].transient = true
	}
	for _, i := range take(r.Stall) {
		// A stalled command is also sent to two partitions at once, so a
		// duplicate is certain to arrive while it runs.
		w.faults[i].stall = true
		w.faults[i].concurrent = true
	}
	for _, i := range rng.Perm(count)[:worker.FaultCount(r.Concurrent, count)] {
		w.faults[i].concurrent = true
	}
	w.counts = faultCounts{invalid: p.Invalids, redeliver: p.Redelivered, resend: p.Resent}
	w.deliveries = len(p.Steps)
	for _, f := range w.faults {
		for _, x := range []struct {
			set bool
			n   *int
		}{{f.transient, &w.counts.transient}, {f.stall, &w.counts.stall}, {f.concurrent, &w.counts.concurrent}} {
			if x.set {
				*x.n++
			}
		}
		if f.concurrent {
			w.deliveries++
		}
	}
	return w
}

// partnerOf is the other partition a concurrent copy of command i goes to.
func (w *workload) partnerOf(i, home int) int {
	return (home + 1 + i%(w.partitions-1)) % w.partitions
}

// copies is the producer's Hooks.Copies: a concurrent command's first send
// also goes to its partner. With flow, it first lets both partitions drain
// (briefly: a stalled one is not waited for), so that the two copies meet in
// two handlers at the same moment.
func (w *workload) copies(flow *tracker, pairWait time.Duration) func(ctx context.Context, i, home int) []int {
	return func(ctx context.Context, i, home int) []int {
		if !w.faults[i].concurrent {
			return nil
		}
		partner := w.partnerOf(i, home)
		if flow != nil {
			flow.waitFor(ctx, pairWait, func(t *tracker) bool { return t.inFlight[home] == 0 && t.inFlight[partner] == 0 })
		}
		return []int{partner}
	}
}

// markFaults makes the plan publish each command's gateway fault in the
// command itself, for a consumer in another process that has no plan.
func (w *workload) markFaults() {
	w.Envelope = func(i int, c worker.Command) any {
		fc := faultyCommand{Command: c}
		switch f := w.faults[i]; {
		case f.transient:
			fc.Fault = faultTransient
		case f.stall:
			fc.Fault = faultStall
		case f.concurrent:
			fc.Fault = faultOverlap
		}
		return fc
	}
}
