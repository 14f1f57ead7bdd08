// Package worker is the integration tests' payments service, the rig
// behind cmd/example-worker's example: the handler (this file), its
// oncemill wiring (wiring.go), the brokers and stores it runs on, the
// consume mode (consume.go) and the workload (demo.go). integration/cmd/
// worker-rig is its command line; integration/cmd/oncemill-soak drives the
// same code with faults injected through Hooks.
package worker

// The payments handler: validate the command, charge the ledger (the side
// effect that must happen once), and produce a payment.settled event. This
// is the handler of cmd/example-worker, with a ledger the tests can count: a
// plain Watermill handler, with oncemill's lease check right before the
// effect.

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
)

// Command is the message the handler consumes. Meta is the envelope: it
// changes when the same command is sent again and is not part of the key
// (see NewKeyGenerator).
type Command struct {
	PaymentID   string      `json:"payment_id"`
	Account     string      `json:"account"`
	AmountCents int64       `json:"amount_cents"`
	Currency    string      `json:"currency"`
	Meta        CommandMeta `json:"meta"`
}

// CommandMeta is the envelope of a Command.
type CommandMeta struct {
	SentAt  string `json:"sent_at"`
	Attempt int    `json:"attempt"`
}

// Settlement is the event produced for a charged payment.
type Settlement struct {
	PaymentID   string `json:"payment_id"`
	Account     string `json:"account"`
	AmountCents int64  `json:"amount_cents"`
	Currency    string `json:"currency"`
}

// ErrInvalidAmount is the handler's permanent failure: an invalid amount
// never becomes valid, so oncemill caches it (NewReceiver lists it in
// CachedErrors) and a duplicate is acked without running again.
var ErrInvalidAmount = errors.New("invalid amount: amount_cents must be positive")

// PaymentHandler is the business logic.
type PaymentHandler struct {
	Ledger Ledger // where charges are booked
	Scope  string // the ledger's scope: the key space of the run
}

// Handle charges one payment command and returns its settlement.
func (h *PaymentHandler) Handle(msg *message.Message) ([]*message.Message, error) {
	var cmd Command
	if err := json.Unmarshal(msg.Payload, &cmd); err != nil {
		return nil, policy.Cached(fmt.Errorf("decode payment command: %w", err))
	}
	if cmd.AmountCents <= 0 {
		return nil, policy.Cached(fmt.Errorf("payment %s: %w (got %d)", cmd.PaymentID, ErrInvalidAmount, cmd.AmountCents))
	}
	// A real service would ask its payment provider here; an error it
	// should retry is returned as policy.Retryable(err).

	// The heartbeat keeps the lease while the process runs, but a pause of
	// the whole process (CPU starvation, a VM freeze) longer than the lease
	// lets a waiting duplicate take the key over; resumed, this handler would
	// charge a second time. The ledger is not always transactional with the
	// store, so the lease is confirmed right before the effect.
	if err := pipeline.CheckLease(msg.Context()); err != nil {
		return nil, policy.Retryable(fmt.Errorf("payment %s: lease check before charging: %w", cmd.PaymentID, err))
	}
	lease, _ := pipeline.ClaimFromContext(msg.Context())
	// The effect. With the postgres store it is written in the transaction
	// that also records the success (see ledger_postgres.go).
	if err := h.Ledger.Charge(msg.Context(), Charge{
		Scope: h.Scope, PaymentID: cmd.PaymentID, MessageUUID: msg.UUID, Token: lease.Token, Attempt: lease.Attempt,
	}); err != nil {
		return nil, policy.Retryable(fmt.Errorf("payment %s: booking the charge: %w", cmd.PaymentID, err))
	}

	payload, err := json.Marshal(Settlement{
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
