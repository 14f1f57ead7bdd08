package worker

// The demo workload: payment commands, the duplicates of at-least-once
// delivery chosen among them, and the producer that publishes them.

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

// Duplicates are fractions of the commands. A rate above zero always
// selects at least one command.
type Duplicates struct {
	Redeliver float64 // the same message (UUID and payload) again, later
	Resend    float64 // the same content under a new UUID, sent_at and attempt, later
	Invalid   float64 // an invalid amount: a cached failure, never charged
}

// DemoDuplicates are the example worker's.
var DemoDuplicates = Duplicates{Redeliver: 0.2, Resend: 0.1, Invalid: 0.02}

// StepKind is what the producer publishes at one step.
type StepKind int

// The kinds of step.
const (
	SendOriginal   StepKind = iota // the first send
	SendRedelivery                 // the first send's message again
	SendResend                     // the command under a new UUID
)

// Step publishes command Cmd.
type Step struct {
	Cmd  int
	Kind StepKind
}

// Plan is the whole workload, fixed before the first publish.
type Plan struct {
	Commands []Command
	Invalid  []bool
	Steps    []Step
	// Redelivered and Resent count the commands with each duplicate.
	Redelivered, Resent, Invalids int
	// Others are the valid commands in a random order, for a caller that
	// picks more of them for something else (the soak tool's faults).
	Others []int
	// Envelope, when set, is what is published for command i (default: c
	// itself).
	Envelope func(i int, c Command) any
}

// duplicateSpread is how many commands later, at most, a redelivery or a
// re-send follows its original.
const duplicateSpread = 256

// NewPlan draws count commands and their duplicates from seed.
func NewPlan(count int, seed uint64, d Duplicates) *Plan {
	rng := rand.New(rand.NewPCG(seed, 0x6f6e63656d696c6c))
	n := count
	p := &Plan{Commands: make([]Command, n), Invalid: make([]bool, n)}
	currencies := []string{"EUR", "USD", "GBP"}
	for i := range p.Commands {
		p.Commands[i] = Command{
			PaymentID:   fmt.Sprintf("p-%06d", i+1),
			Account:     fmt.Sprintf("acc-%d", rng.IntN(50)+1),
			AmountCents: rng.Int64N(100_000) + 1,
			Currency:    currencies[rng.IntN(len(currencies))],
		}
	}
	order := rng.Perm(n)
	p.Invalids = FaultCount(d.Invalid, n)
	for _, i := range order[:p.Invalids] {
		p.Invalid[i] = true
		p.Commands[i].AmountCents = -rng.Int64N(100) // zero or negative
	}
	p.Others = order[p.Invalids:]

	// The schedule: originals in order, each duplicate 1..spread commands
	// after its original.
	spread := min(n, duplicateSpread)
	later := make([][]Step, n+spread+1)
	schedule := func(rate float64, kind StepKind) int {
		k := FaultCount(rate, n)
		for _, i := range rng.Perm(n)[:k] {
			at := i + 1 + rng.IntN(spread)
			later[at] = append(later[at], Step{Cmd: i, Kind: kind})
		}
		return k
	}
	p.Redelivered = schedule(d.Redeliver, SendRedelivery)
	p.Resent = schedule(d.Resend, SendResend)
	for slot := range later {
		if slot < n {
			p.Steps = append(p.Steps, Step{Cmd: slot, Kind: SendOriginal})
		}
		p.Steps = append(p.Steps, later[slot]...)
	}
	return p
}

// FaultCount turns a rate into a number of n commands; a rate above zero
// selects at least one.
func FaultCount(rate float64, n int) int {
	k := int(math.Round(rate * float64(n)))
	if rate > 0 && k == 0 {
		k = 1
	}
	return min(k, n)
}

// Valid reports whether command i must take effect.
func (p *Plan) Valid(i int) bool { return !p.Invalid[i] }

// Partition is command i's home among partitions: hash(payment_id) % partitions.
func (p *Plan) Partition(i, partitions int) int {
	h := fnv.New32a()
	h.Write([]byte(p.Commands[i].PaymentID))
	return int(h.Sum32() % uint32(partitions))
}

// message is command i under a new UUID, stamped now with attempt.
func (p *Plan) message(i, attempt int) (*message.Message, error) {
	cmd := p.Commands[i]
	cmd.Meta = CommandMeta{SentAt: time.Now().UTC().Format(time.RFC3339Nano), Attempt: attempt}
	var body any = cmd
	if p.Envelope != nil {
		body = p.Envelope(i, cmd)
	}
	payload, err := json.Marshal(body)
	if err != nil {
		return nil, fmt.Errorf("marshal payment command %s: %w", cmd.PaymentID, err)
	}
	return message.NewMessage(watermill.NewUUID(), payload), nil
}

// Producer publishes a plan's steps to the payments topics.
type Producer struct {
	Plan       *Plan
	Pub        message.Publisher
	Topics     Topics
	Partitions int
	Keys       keygen.Generator
	// Room, when set, waits until n more deliveries fit in flight.
	Room func(ctx context.Context, n int) error
	// Publishing, when set, is told of each delivery before it is published.
	Publishing func(partition int, uuid string)
	// Copies is Hooks.Copies.
	Copies func(ctx context.Context, i, home int) []int

	Commands   int                 // commands whose first send is published
	Deliveries int                 // messages published, duplicates included
	KeysSeen   map[string]struct{} // distinct keys of everything published
	sent       []*message.Message  // the first send of each command, for redeliveries
}

// Run publishes every step; it returns early only when ctx ends or a
// publish fails.
func (pr *Producer) Run(ctx context.Context) error {
	pr.KeysSeen = map[string]struct{}{}
	pr.sent = make([]*message.Message, len(pr.Plan.Commands))
	for _, s := range pr.Plan.Steps {
		if err := pr.publishStep(ctx, s); err != nil {
			return err
		}
	}
	return nil
}

func (pr *Producer) publishStep(ctx context.Context, s Step) error {
	var msg *message.Message
	var err error
	switch s.Kind {
	case SendOriginal:
		msg, err = pr.Plan.message(s.Cmd, 1)
		pr.sent[s.Cmd] = msg
		pr.Commands++
	case SendRedelivery:
		first := pr.sent[s.Cmd]
		msg = message.NewMessage(first.UUID, first.Payload)
	case SendResend:
		msg, err = pr.Plan.message(s.Cmd, 2)
	}
	if err != nil {
		return err
	}
	if s.Kind != SendRedelivery {
		// The same content must be the same key; count what the keys say.
		key, err := pr.Keys.Key(msg)
		if err != nil {
			return fmt.Errorf("key of %s: %w", pr.Plan.Commands[s.Cmd].PaymentID, err)
		}
		pr.KeysSeen[key] = struct{}{}
	}
	partitions := []int{pr.Plan.Partition(s.Cmd, pr.Partitions)}
	if s.Kind == SendOriginal && pr.Copies != nil {
		partitions = append(partitions, pr.Copies(ctx, s.Cmd, partitions[0])...)
	}
	if pr.Room != nil {
		if err := pr.Room(ctx, len(partitions)); err != nil {
			return err
		}
	}
	// All copies back to back, so that they meet in the handlers.
	for _, partition := range partitions {
		if pr.Publishing != nil {
			pr.Publishing(partition, msg.UUID)
		}
		topic := pr.Topics.Payments(partition)
		if err := pr.Pub.Publish(topic, message.NewMessage(msg.UUID, msg.Payload)); err != nil {
			return fmt.Errorf("publish to %s: %w", topic, err)
		}
		pr.Deliveries++
	}
	return nil
}
