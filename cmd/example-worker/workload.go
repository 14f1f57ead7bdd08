package main

// The workload: N unique payment commands, the faults of at-least-once
// delivery chosen among them, and the producer that publishes the lot.

import (
	"context"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
)

// paymentCommand is the message the handlers consume. Meta is the envelope:
// it changes when the same command is sent again and is not part of the key.
type paymentCommand struct {
	PaymentID   string      `json:"payment_id"`
	Account     string      `json:"account"`
	AmountCents int64       `json:"amount_cents"`
	Currency    string      `json:"currency"`
	Meta        commandMeta `json:"meta"`
	// Fault, when set, tells the simulated gateway to misbehave for this
	// command (faultTransient, faultStall, faultOverlap). A self-contained
	// run keeps its faults in its plan; the producer mode sends them here.
	Fault string `json:"fault,omitempty"`
}

type commandMeta struct {
	SentAt  string `json:"sent_at"`
	Attempt int    `json:"attempt"`
}

// faults are what happens to one command. The first three change how the
// handler behaves and are exclusive; the last three are extra deliveries.
type faults struct {
	invalid   bool // amount_cents <= 0: a permanent failure, never charged
	transient bool // the gateway times out on the first call
	stall     bool // the gateway stalls for 1.5x the lease (also sent concurrently)

	redeliver  bool // the same message (UUID and payload) again, later
	resend     bool // the same content under a new UUID, sent_at and attempt, later
	concurrent bool // the same message on a second partition at the same moment
}

// stepKind is what the producer publishes at one step.
type stepKind int

const (
	sendOriginal stepKind = iota // the first send; a copy too when concurrent
	sendRedelivery
	sendResend
)

type step struct {
	cmd  int
	kind stepKind
}

// plan is the whole workload, fixed before the first publish.
type plan struct {
	commands   []paymentCommand
	faults     []faults
	steps      []step
	deliveries int // publishes in all: steps plus concurrent copies
	partitions int
	counts     faultCounts
}

type faultCounts struct {
	invalid, transient, stall, redeliver, resend, concurrent int
}

// duplicateSpread is how many commands later, at most, a redelivery or a
// re-send follows its original.
const duplicateSpread = 256

func newPlan(cfg config) *plan {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6f6e63656d696c6c))
	n := cfg.Count
	p := &plan{
		commands:   make([]paymentCommand, n),
		faults:     make([]faults, n),
		partitions: cfg.Partitions,
	}
	currencies := []string{"EUR", "USD", "GBP"}
	for i := range p.commands {
		p.commands[i] = paymentCommand{
			PaymentID:   fmt.Sprintf("p-%06d", i+1),
			Account:     fmt.Sprintf("acc-%d", rng.IntN(50)+1),
			AmountCents: rng.Int64N(100_000) + 1,
			Currency:    currencies[rng.IntN(len(currencies))],
		}
	}

	// Handler faults are drawn from one shuffled order, so no command has two.
	order := rng.Perm(n)
	take := func(rate float64) []int {
		k := min(faultCount(rate, n), len(order))
		picked := order[:k]
		order = order[k:]
		return picked
	}
	for _, i := range take(cfg.Permanent) {
		p.faults[i].invalid = true
		p.commands[i].AmountCents = -rng.Int64N(100) // zero or negative
	}
	for _, i := range take(cfg.Transient) {
		p.faults[i].transient = true
	}
	for _, i := range take(cfg.Stall) {
		// A stalled command is also sent to two partitions at once, so a
		// duplicate is certain to arrive while it runs.
		p.faults[i].stall = true
		p.faults[i].concurrent = true
	}
	// Delivery faults are drawn independently: any command, invalid ones too.
	pick := func(rate float64) []int { return rng.Perm(n)[:faultCount(rate, n)] }
	for _, i := range pick(cfg.Redeliver) {
		p.faults[i].redeliver = true
	}
	for _, i := range pick(cfg.Resend) {
		p.faults[i].resend = true
	}
	for _, i := range pick(cfg.Concurrent) {
		p.faults[i].concurrent = true
	}

	// The schedule: originals in order, each extra delivery 1..spread
	// commands after its original.
	spread := min(n, duplicateSpread)
	later := make([][]step, n+spread+1)
	for i, f := range p.faults {
		if f.redeliver {
			at := i + 1 + rng.IntN(spread)
			later[at] = append(later[at], step{cmd: i, kind: sendRedelivery})
		}
		if f.resend {
			at := i + 1 + rng.IntN(spread)
			later[at] = append(later[at], step{cmd: i, kind: sendResend})
		}
	}
	for slot := range later {
		if slot < n {
			p.steps = append(p.steps, step{cmd: slot, kind: sendOriginal})
		}
		p.steps = append(p.steps, later[slot]...)
	}

	p.deliveries = len(p.steps)
	for _, f := range p.faults {
		p.counts.add(f)
		if f.concurrent {
			p.deliveries++
		}
	}
	return p
}

// faultCount turns a rate into a number of commands; a rate above zero
// selects at least one.
func faultCount(rate float64, n int) int {
	k := int(math.Round(rate * float64(n)))
	if rate > 0 && k == 0 {
		k = 1
	}
	return min(k, n)
}

func (c *faultCounts) add(f faults) {
	for _, x := range []struct {
		set bool
		n   *int
	}{
		{f.invalid, &c.invalid}, {f.transient, &c.transient}, {f.stall, &c.stall},
		{f.redeliver, &c.redeliver}, {f.resend, &c.resend}, {f.concurrent, &c.concurrent},
	} {
		if x.set {
			*x.n++
		}
	}
}

func (p *plan) valid(i int) bool { return !p.faults[i].invalid }

// markFaults writes each command's gateway fault into the command itself,
// for a consumer in another process that has no plan.
func (p *plan) markFaults() {
	for i, f := range p.faults {
		switch {
		case f.transient:
			p.commands[i].Fault = faultTransient
		case f.stall:
			p.commands[i].Fault = faultStall
		case f.concurrent:
			p.commands[i].Fault = faultOverlap
		}
	}
}

// partitionOf is the command's home partition: hash(payment_id) % P.
func (p *plan) partitionOf(cmd int) int {
	h := fnv.New32a()
	h.Write([]byte(p.commands[cmd].PaymentID))
	return int(h.Sum32() % uint32(p.partitions))
}

// partnerOf is the other partition a concurrent duplicate goes to.
func (p *plan) partnerOf(cmd int) int {
	return (p.partitionOf(cmd) + 1 + cmd%(p.partitions-1)) % p.partitions
}

// producer publishes the plan.
type producer struct {
	plan     *plan
	pub      message.Publisher
	topics   topics
	keys     keygen.Generator
	flow     *tracker
	inFlight int // most deliveries unacknowledged before the producer waits
	// pairWait bounds the wait for both partitions of a concurrent duplicate
	// to be idle, so its two copies meet in two handlers at the same moment.
	pairWait time.Duration

	sent     []*message.Message  // the first send of each command, for redeliveries
	keysSeen map[string]struct{} // distinct keys of everything published
	commands int                 // commands whose first send is published
}

func newProducer(p *plan, pub message.Publisher, tp topics, keys keygen.Generator, flow *tracker, inFlight int) *producer {
	return &producer{
		plan:     p,
		pub:      pub,
		topics:   tp,
		keys:     keys,
		flow:     flow,
		inFlight: inFlight,
		pairWait: 2 * time.Millisecond,
		sent:     make([]*message.Message, len(p.commands)),
		keysSeen: map[string]struct{}{},
	}
}

// run publishes every step; it returns early only when ctx ends or a publish fails.
func (pr *producer) run(ctx context.Context) error {
	for _, s := range pr.plan.steps {
		if err := pr.publishStep(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

func (pr *producer) publishStep(ctx context.Context, s step) error {
	home := pr.plan.partitionOf(s.cmd)
	var msg *message.Message
	var err error
	switch s.kind {
	case sendOriginal:
		msg, err = newCommandMessage(pr.plan.commands[s.cmd], 1)
		pr.sent[s.cmd] = msg
		pr.commands++
	case sendRedelivery:
		first := pr.sent[s.cmd]
		msg = message.NewMessage(first.UUID, first.Payload)
	case sendResend:
		msg, err = newCommandMessage(pr.plan.commands[s.cmd], 2)
	}
	if err != nil {
		return err
	}
	if s.kind != sendRedelivery {
		// The same content must be the same key; count what the keys say.
		key, err := pr.keys.Key(msg)
		if err != nil {
			return fmt.Errorf("key of %s: %w", pr.plan.commands[s.cmd].PaymentID, err)
		}
		pr.keysSeen[key] = struct{}{}
	}

	if s.kind != sendOriginal || !pr.plan.faults[s.cmd].concurrent {
		if err := pr.waitForRoom(ctx, 1); err != nil {
			return err
		}
		return pr.publish(home, msg)
	}

	// A concurrent duplicate: let both partitions drain (briefly, a stalled
	// one is not waited for), then publish both copies back to back.
	partner := pr.plan.partnerOf(s.cmd)
	if pr.pairWait > 0 {
		pr.flow.waitFor(ctx, pr.pairWait, func(t *tracker) bool {
			return t.inFlight[home] == 0 && t.inFlight[partner] == 0
		})
	}
	if err := pr.waitForRoom(ctx, 2); err != nil {
		return err
	}
	if err := pr.publish(home, msg); err != nil {
		return err
	}
	return pr.publish(partner, message.NewMessage(msg.UUID, msg.Payload))
}

// waitForRoom waits until n more deliveries fit in the in-flight window
// (inFlight <= 0: no window, as in the producer mode, which sees no acks).
func (pr *producer) waitForRoom(ctx context.Context, n int) error {
	if pr.inFlight <= 0 {
		return ctx.Err()
	}
	pr.flow.waitFor(ctx, 0, func(t *tracker) bool { return t.published-t.acked+n <= pr.inFlight })
	return ctx.Err()
}

func (pr *producer) publish(partition int, msg *message.Message) error {
	pr.flow.publishing(partition, msg.UUID)
	if err := pr.pub.Publish(pr.topics.payments(partition), msg); err != nil {
		return fmt.Errorf("publish to %s: %w", pr.topics.payments(partition), err)
	}
	return nil
}

// newCommandMessage sends cmd under a new UUID, stamped now with the given attempt.
func newCommandMessage(cmd paymentCommand, attempt int) (*message.Message, error) {
	cmd.Meta = commandMeta{SentAt: time.Now().UTC().Format(time.RFC3339Nano), Attempt: attempt}
	payload, err := json.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("marshal payment command %s: %w", cmd.PaymentID, err)
	}
	return message.NewMessage(watermill.NewUUID(), payload), nil
}
