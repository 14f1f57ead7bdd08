package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/integration/internal/sentinel"
)

// TestRedisFailover kills the Redis primary under the lease mode, with its
// records in Redis and the ledger, the handler's effect, in PostgreSQL
// (--ledger=postgres), three workers on RabbitMQ following the primary
// through go-redis's failover client (--redis-sentinel), failoverMessages
// payments and a duplicate of 30% of them; the primary is SIGKILLed in the
// middle, and Sentinel promotes one of its two replicas. With
// --redis-wait-replicas=1 no payment may be lost or charged twice; without
// WAIT, a completion the primary acknowledged but no replica had yet is
// lost, and a duplicate of it after the failover charges again: those
// doubles are counted and logged. Every worker must process a payment
// within 30 s of the kill, without a restart.
func TestRedisFailover(t *testing.T) {
	for _, wait := range []int{1, 0} {
		t.Run(fmt.Sprintf("wait=%d", wait), func(t *testing.T) { runRedisFailover(t, wait) })
	}
}

const (
	failoverPublishFor = 20 * time.Second
	failoverKillAt     = 10 * time.Second // after the first payment
	failoverLiveness   = 90 * time.Second
)

func runRedisFailover(t *testing.T, wait int) {
	g := sentinel.Start(t, 2)
	ledgerKind := storeKindNamed(t, "postgres")
	sk := storeKind{
		name: "redis-sentinel",
		workerArgs: func(ns string) []string {
			args := []string{"--store=redis", "--redis-sentinel=" + g.Sentinel.Addr, "--redis-master=" + sentinel.MasterName, "--redis-prefix=" + ns}
			if wait > 0 {
				args = append(args, fmt.Sprintf("--redis-wait-replicas=%d", wait), "--redis-wait-timeout="+failoverWait.String())
			}
			return args
		},
		ledger:  ledgerKind.ledger,
		cleanup: ledgerKind.cleanup, // the records go with the servers
	}
	h := newHarness(t, brokerKindNamed(t, "amqp-v3"), sk)
	// A lease longer than the failover: a completion that fails during it
	// is tried again while the lease is held, and recorded on the new
	// primary, rather than given up on.
	args := []string{"--ledger=postgres", "--ledger-postgres-dsn=" + env.postgresDSN, "--postgres-schema=" + h.ns, "--lease=10s"}
	workers := make([]*worker, 3)
	for i := range workers {
		workers[i] = h.start(fmt.Sprintf("worker-%d", i), args...)
	}
	dead := h.observe(h.deadLetters())
	old, err := g.Primary(t.Context())
	must(t, err)

	// The payments, and a duplicate (the same message again) of 30% of
	// them, 50 payments later.
	total := failoverMessages + int(failoverMessages*failoverDupShare)
	published := make(chan struct{})
	begin := time.Now()
	go func() {
		defer close(published)
		const batches = 200
		per := failoverMessages / batches
		tick := time.NewTicker(failoverPublishFor / batches)
		defer tick.Stop()
		publish := func(m *message.Message) bool {
			if err := h.pub.Publish(h.payments(), m); err != nil {
				t.Errorf("publish: %v", err)
				return false
			}
			return true
		}
		var dups []commandMsg
		for b := range batches {
			for j := range per {
				i := b*per + j
				m := newCommand(t, fmt.Sprintf("p-%d", i), 1500, "", 1)
				if !publish(m) {
					return
				}
				if i%10 < 3 {
					dups = append(dups, commandMsg{at: i + 50, m: m})
				}
				for len(dups) > 0 && dups[0].at <= i {
					if !publish(again(dups[0].m)) {
						return
					}
					dups = dups[1:]
				}
			}
			<-tick.C
		}
		for _, d := range dups {
			if !publish(again(d.m)) {
				return
			}
		}
	}()

	time.Sleep(time.Until(begin.Add(failoverKillAt)))
	g.Server(old).Kill()
	kill := time.Now()
	promoted := g.WaitFailover(t, old, failoverResume)
	t.Logf("primary %s killed %v after the first payment; Sentinel promoted %s %v after the kill",
		old, kill.Sub(begin).Round(time.Millisecond), promoted, time.Since(kill).Round(time.Millisecond))
	<-published

	// Until every delivery is decided: executed or replayed, once for each
	// message published.
	var events []killsEvent
	deadline := time.Now().Add(failoverLiveness)
	for {
		events = events[:0]
		for _, w := range workers {
			events = append(events, workerEvents(t, w)...)
		}
		done := 0
		for _, ev := range events {
			if ev.Outcome == "executed" || ev.Outcome == "replayed" {
				done++
			}
		}
		if done >= total {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("%d of %d deliveries decided %v after the last publish", done, total, failoverLiveness)
			break
		}
		time.Sleep(time.Second)
	}
	for _, w := range workers {
		w.kill()
	}

	// Each worker resumed after the kill, without a restart.
	var firstAfter time.Duration
	for _, w := range workers {
		var first time.Time
		for _, ev := range workerEvents(t, w) {
			if ev.Outcome == "executed" && ev.Time.After(kill) {
				first = ev.Time
				break
			}
		}
		switch {
		case first.IsZero():
			t.Errorf("%s processed no payment after the kill", w.name)
		case first.Sub(kill) > failoverResume:
			t.Errorf("%s processed its first payment %v after the kill, beyond %v", w.name, first.Sub(kill), failoverResume)
		case firstAfter == 0 || first.Sub(kill) < firstAfter:
			firstAfter = first.Sub(kill)
		}
	}

	byOutcome := map[string]int{}
	for _, ev := range events {
		byOutcome[ev.Outcome]++
	}
	counts := h.ledger()
	var lost, doubled []string
	for i := range failoverMessages {
		id := fmt.Sprintf("p-%d", i)
		switch n := counts[id]; {
		case n == 0:
			lost = append(lost, id)
		case n > 1:
			doubled = append(doubled, id)
		}
	}
	t.Logf("WAIT %d: %d payments, %d messages; deliveries %v; first payment processed %v after the kill; lost %d, doubled %d %v, dead-lettered %d",
		wait, failoverMessages, total, byOutcome, firstAfter.Round(time.Millisecond), len(lost), len(doubled), doubled, len(dead.received()))
	if len(lost) > 0 {
		t.Errorf("%d payments have no charge (lost), e.g. %s", len(lost), strings.Join(lost[:min(5, len(lost))], ", "))
	}
	if wait > 0 && len(doubled) > 0 {
		t.Errorf("with WAIT %d, %d payments charged more than once, e.g. %s", wait, len(doubled), strings.Join(doubled[:min(5, len(doubled))], ", "))
	}
	if wait > 0 && len(dead.received()) > 0 {
		t.Errorf("with WAIT %d, %d messages dead-lettered", wait, len(dead.received()))
	}
}

// commandMsg is a message to publish again at payment at.
type commandMsg struct {
	at int
	m  *message.Message
}
