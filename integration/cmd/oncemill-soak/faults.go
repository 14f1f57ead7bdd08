package main

// The faults of the simulated payment gateway, injected between oncemill's
// receiver and the payment handler: a gateway that times out once
// (transient), one that stalls past the lease (stall), and the latency
// that makes concurrent copies meet in two handlers (overlap). A run takes
// them from its plan; a consumer in another process from the "fault" field
// the produce mode adds to each command.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/integration/internal/worker"
	"github.com/oncemill/oncemill/policy"
)

var errGatewayTimeout = errors.New("payment gateway timed out")

// Faults a command can carry in its "fault" field.
const (
	faultTransient = "transient" // the first call in this process times out
	faultStall     = "stall"     // the call takes 1.5x the lease
	faultOverlap   = "overlap"   // the call takes --overlap, so concurrent copies meet
)

// faultyCommand is a command as the produce mode publishes it: with the
// fault a consumer in another process must inject.
type faultyCommand struct {
	worker.Command
	Fault string `json:"fault,omitempty"`
}

// gateway simulates the payment provider and its faults, per payment_id.
type gateway struct {
	transient map[string]bool          // time out on the first call
	delay     map[string]time.Duration // answer only after this long
	latency   time.Duration            // every call takes at least this long
	stall     time.Duration            // the delay of a command marked "stall"
	overlap   time.Duration            // the delay of a command marked "overlap"

	mu       sync.Mutex
	timedOut map[string]bool // payments that already had their timeout
}

// newGateway sets the faults of w: a stalled command takes stall, and a
// command delivered to two partitions at once takes overlap, so that its
// second copy arrives while the first is still running. w may be nil (a
// consumer without a plan: the commands carry their faults).
func newGateway(w *workload, stall, overlap, latency time.Duration) *gateway {
	g := &gateway{
		transient: map[string]bool{},
		delay:     map[string]time.Duration{},
		latency:   latency,
		stall:     stall,
		overlap:   overlap,
		timedOut:  map[string]bool{},
	}
	if w == nil {
		return g
	}
	for i, f := range w.faults {
		id := w.Commands[i].PaymentID
		switch {
		case f.transient:
			g.transient[id] = true
		case f.stall:
			g.delay[id] = stall
		}
		if f.concurrent && g.delay[id] == 0 && overlap > 0 {
			g.delay[id] = overlap
		}
	}
	return g
}

// authorize fails the first call for a transient payment, and is slow for
// a delayed one (giving up if ctx ends, e.g. because oncemill lost the
// lease).
func (g *gateway) authorize(ctx context.Context, paymentID, fault string) error {
	if g.transient[paymentID] || fault == faultTransient {
		g.mu.Lock()
		first := !g.timedOut[paymentID]
		g.timedOut[paymentID] = true
		g.mu.Unlock()
		if first {
			return errGatewayTimeout
		}
	}
	d := g.delay[paymentID]
	switch fault {
	case faultStall:
		d = g.stall
	case faultOverlap:
		d = max(d, g.overlap)
	}
	if d = max(d, g.latency); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return fmt.Errorf("gateway call abandoned: %w", context.Cause(ctx))
		}
	}
	return nil
}

// middleware calls the gateway before the payment handler runs, as the
// handler of a real service would call its provider. A message that is no
// command goes on to the handler, which refuses it.
func (g *gateway) middleware(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var cmd faultyCommand
		if json.Unmarshal(msg.Payload, &cmd) == nil && cmd.AmountCents > 0 {
			if err := g.authorize(msg.Context(), cmd.PaymentID, cmd.Fault); err != nil {
				return nil, policy.Retryable(fmt.Errorf("payment %s: %w", cmd.PaymentID, err))
			}
		}
		return h(msg)
	}
}
