package main

// The payments handler: validate the command, call the (simulated) payment
// gateway, charge the ledger, and produce a payment.settled event.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
)

var (
	errInvalidAmount  = errors.New("invalid amount: amount_cents must be positive")
	errGatewayTimeout = errors.New("payment gateway timed out")
)

// gateway simulates the payment provider and its faults, per payment_id.
// A self-contained run sets the faults from its plan; a command may also
// carry its own fault (paymentCommand.Fault), as the producer mode sends
// them to a separate consumer.
type gateway struct {
	transient map[string]bool          // time out on the first call
	delay     map[string]time.Duration // answer only after this long
	latency   time.Duration            // every call takes at least this long
	stall     time.Duration            // the delay of a command marked "stall"
	overlap   time.Duration            // the delay of a command marked "overlap"

	mu       sync.Mutex
	timedOut map[string]bool // payments that already had their timeout
}

// Faults a command can carry in paymentCommand.Fault.
const (
	faultTransient = "transient" // the first call in this process times out
	faultStall     = "stall"     // the call takes 1.5x the lease
	faultOverlap   = "overlap"   // the call takes --overlap, so concurrent copies meet
)

// newGateway sets the faults of p: a stalled command takes stall, and a
// command delivered to two partitions at once takes overlap, so that its
// second copy arrives while the first is still running. p may be nil (a
// consumer without a plan).
func newGateway(p *plan, stall, overlap, latency time.Duration) *gateway {
	g := &gateway{
		transient: map[string]bool{},
		delay:     map[string]time.Duration{},
		latency:   latency,
		stall:     stall,
		overlap:   overlap,
		timedOut:  map[string]bool{},
	}
	if p == nil {
		return g
	}
	for i, f := range p.faults {
		id := p.commands[i].PaymentID
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

// authorize answers before the charge is booked. It fails the first call for
// a transient payment, and is slow for a delayed one (giving up if ctx ends,
// e.g. because oncemill lost the lease).
func (g *gateway) authorize(ctx context.Context, cmd paymentCommand) error {
	if g.transient[cmd.PaymentID] || cmd.Fault == faultTransient {
		g.mu.Lock()
		first := !g.timedOut[cmd.PaymentID]
		g.timedOut[cmd.PaymentID] = true
		g.mu.Unlock()
		if first {
			return errGatewayTimeout
		}
	}
	d := g.delay[cmd.PaymentID]
	switch cmd.Fault {
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

// paymentHandler is the business logic.
type paymentHandler struct {
	gateway *gateway
	ledger  effectLedger
	scope   string // the ledger's scope: the run's key space
}

// settlement is the event produced for a charged payment.
type settlement struct {
	PaymentID   string `json:"payment_id"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

func (h *paymentHandler) handle(msg *message.Message) ([]*message.Message, error) {
	var cmd paymentCommand
	if err := json.Unmarshal(msg.Payload, &cmd); err != nil {
		return nil, policy.Permanent(fmt.Errorf("decode payment command: %w", err))
	}
	if cmd.AmountCents <= 0 {
		return nil, policy.Permanent(fmt.Errorf("payment %s: %w (got %d)", cmd.PaymentID, errInvalidAmount, cmd.AmountCents))
	}
	if err := h.gateway.authorize(msg.Context(), cmd); err != nil {
		return nil, policy.Transient(fmt.Errorf("payment %s: %w", cmd.PaymentID, err))
	}

	// The heartbeat keeps the lease while the process runs, but a pause of
	// the whole process (CPU starvation, a VM freeze) longer than the lease
	// lets a waiting duplicate take the key over; resumed, this handler would
	// charge a second time. The ledger is not transactional with the store,
	// so the lease is confirmed right before the effect. Without oncemill
	// (--no-idempotency) CheckLease is a no-op.
	if err := pipeline.CheckLease(msg.Context()); err != nil {
		return nil, policy.Transient(fmt.Errorf("payment %s: lease check before charging: %w", cmd.PaymentID, err))
	}
	lease, _ := pipeline.LeaseFromContext(msg.Context())
	// The effect. With the postgres store it is written in the transaction
	// that also records the success (see effects_postgres.go).
	if err := h.ledger.charge(msg.Context(), charge{
		Scope: h.scope, PaymentID: cmd.PaymentID, MessageUUID: msg.UUID, Token: lease.Token, Attempt: lease.Attempt,
	}); err != nil {
		return nil, policy.Transient(fmt.Errorf("payment %s: booking the charge: %w", cmd.PaymentID, err))
	}

	payload, err := json.Marshal(settlement{
		PaymentID: cmd.PaymentID, Account: cmd.Account, AmountCents: cmd.AmountCents, Currency: cmd.Currency,
	})
	if err != nil {
		return nil, fmt.Errorf("encode settlement: %w", err)
	}
	settled := message.NewMessage(watermill.NewUUID(), payload)
	settled.Metadata.Set("type", "payment.settled")
	settled.Metadata.Set("payment_id", cmd.PaymentID)
	if lease.Token != 0 {
		// A downstream system that checks fencing tokens can refuse a
		// stale worker's late write with these.
		settled.Metadata.Set("fencing_token", strconv.FormatInt(lease.Token, 10))
		settled.Metadata.Set("attempt", strconv.Itoa(lease.Attempt))
	}
	return []*message.Message{settled}, nil
}

// withoutIdempotency is the baseline (--no-idempotency): the handler as a
// plain Watermill consumer runs it, so every delivery executes. A failure
// marked permanent is logged and acked, as a plain handler must (a nack would
// be redelivered forever); any other failure is nacked and redelivered. It
// reports the same events as oncemill, so the accounting is shared.
func withoutIdempotency(logger watermill.LoggerAdapter, onEvent func(pipeline.Event)) message.HandlerMiddleware {
	classify := policy.Default()
	return func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			msgs, err := h(msg)
			ev := pipeline.Event{MessageUUID: msg.UUID, Outcome: pipeline.OutcomeExecuted, Err: err}
			switch {
			case err == nil:
			case classify.IsPermanent(err):
				ev.Outcome = pipeline.OutcomeFailureCached
				logger.Error("Handler failed permanently; the message is acked", err, watermill.LogFields{"message_uuid": msg.UUID})
				msgs, err = nil, nil
			default:
				ev.Outcome = pipeline.OutcomeReleased
			}
			onEvent(ev)
			return msgs, err
		}
	}
}
