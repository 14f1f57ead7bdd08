package integration

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/integration/internal/sentinel"
)

// TestRedisFailover kills the Redis primary under the lease mode, with its
// records in Redis and the ledger, the handler's effect, in PostgreSQL
// (--ledger=postgres), three workers on Kafka and on RabbitMQ following
// the primary through go-redis's failover client (--redis-sentinel),
// failoverMessages payments and a duplicate of 30% of them; the primary is
// SIGKILLed in the middle, and Sentinel promotes one of its two replicas,
// which get the primary's writes failoverRedisLatency late.
// Once the new primary is up, the payments the workers finished in the
// last failoverResendWindow before the kill are published again: a
// success record the old primary acknowledged but no replica had yet is
// gone, and its duplicate is charged again.
//
// With --redis-wait-replicas=1 no payment may be lost or charged twice;
// without WAIT none may be lost (the charge is in PostgreSQL), and the
// doubles are counted and logged. Every worker must decide a delivery
// within failoverResume of the kill, without a restart.
func TestRedisFailover(t *testing.T) {
	for _, broker := range []string{"kafka", "amqp-v3"} {
		for _, wait := range []int{1, 0} {
			t.Run(fmt.Sprintf("%s/wait=%d", broker, wait), func(t *testing.T) {
				runRedisFailover(t, brokerKindNamed(t, broker), wait)
			})
		}
	}
}

const (
	failoverPublishFor = 20 * time.Second
	failoverKillAt     = 10 * time.Second // after the first payment
	failoverLiveness   = 90 * time.Second
	failoverBatches    = 200 // of payments, one every failoverPublishFor/failoverBatches
	// failoverResendWindow and failoverResend choose the payments published
	// again after the failover: up to failoverResend of those finished in
	// the window before the kill, the latest first.
	failoverResendWindow = time.Second
	failoverResend       = 100
	// failoverRedisLatency delays the replication stream to each replica,
	// as failoverReplicationLatency does PostgreSQL's.
	failoverRedisLatency = 20 * time.Millisecond
)

// startFailoverWorkers starts failoverWorkers workers with args; on Kafka
// each consumes a partition of its own, and it waits until the group has
// assigned them.
func startFailoverWorkers(t *testing.T, h *harness, args ...string) []*worker {
	t.Helper()
	if h.broker.name == "kafka" {
		args = append(args, fmt.Sprintf("--kafka-partitions=%d", failoverWorkers))
	}
	workers := make([]*worker, failoverWorkers)
	for i := range workers {
		workers[i] = h.start(fmt.Sprintf("worker-%d", i), args...)
	}
	if h.broker.name == "kafka" {
		group := h.ns + "-" + h.payments()
		eventually(t, limit, func() bool { return kafkaGroupReady(t, group, failoverWorkers) },
			func() string { return "consumer group " + group + " has not assigned partitions to every worker" })
	}
	return workers
}

func runRedisFailover(t *testing.T, bk brokerKind, wait int) {
	g := sentinel.Start(t, 2, failoverRedisLatency)
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
	h := newHarness(t, bk, sk)
	// A lease longer than the failover: a completion that fails during it
	// is tried again while the lease is held, and recorded on the new
	// primary, rather than given up on.
	workers := startFailoverWorkers(t, h, "--ledger=postgres", "--ledger-postgres-dsn="+env.postgresDSN, "--postgres-schema="+h.ns, "--lease=10s")
	dead := h.observe(h.deadLetters())
	old, err := g.Primary(t.Context())
	must(t, err)

	// The payments, and a duplicate (the same message again) of 30% of
	// them, 50 payments later.
	msgs := payments(t, failoverMessages)
	byUUID := map[string]*message.Message{}
	for _, m := range msgs {
		byUUID[m.UUID] = m
	}
	var dups []commandMsg
	then := func(i int) []*message.Message {
		if i%10 < 3 {
			dups = append(dups, commandMsg{at: i + 50, m: msgs[i]})
		}
		var out []*message.Message
		for len(dups) > 0 && (dups[0].at <= i || i == len(msgs)-1) {
			out = append(out, again(dups[0].m))
			dups = dups[1:]
		}
		return out
	}
	total := failoverMessages + int(failoverMessages*failoverDupShare)
	begin := time.Now()
	published := h.publishPaced(msgs, failoverBatches, failoverPublishFor, func(int) string { return h.payments() }, then)

	// The kill somewhere in a batch's processing, not on the tick that
	// publishes the next, when every earlier batch is long finished.
	time.Sleep(time.Until(begin.Add(failoverKillAt + rand.N(failoverPublishFor/failoverBatches))))
	g.Server(old).Kill()
	kill := time.Now()
	promoted := g.WaitFailover(t, old, failoverResume)
	t.Logf("primary %s killed %v after the first payment; Sentinel promoted %s %v after the kill",
		old, kill.Sub(begin).Round(time.Millisecond), promoted, time.Since(kill).Round(time.Millisecond))
	<-published

	// The payments finished just before the kill, again, on the new primary.
	var before []killsEvent
	for _, w := range workers {
		for _, ev := range workerEvents(t, w) {
			if ev.Outcome == "executed" && !ev.Time.After(kill) && kill.Sub(ev.Time) < failoverResendWindow {
				before = append(before, ev)
			}
		}
	}
	slices.SortFunc(before, func(a, b killsEvent) int { return b.Time.Compare(a.Time) })
	resent := map[string]bool{}
	for _, ev := range before {
		if m := byUUID[ev.MessageUUID]; m != nil && !resent[m.UUID] && len(resent) < failoverResend {
			resent[m.UUID] = true
			h.publish(again(m))
		}
	}
	total += len(resent)
	var lastBefore time.Duration
	if len(before) > 0 {
		lastBefore = kill.Sub(before[0].Time)
	}

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
	firstAfter := resumeOf(t, workers, kill)

	byOutcome := map[string]int{}
	for _, ev := range events {
		byOutcome[ev.Outcome]++
	}
	counts := h.ledger()
	var lost, doubled []string
	doubledResent := 0
	for i, m := range msgs {
		id := fmt.Sprintf("p-%d", i)
		switch n := counts[id]; {
		case n == 0:
			lost = append(lost, id)
		case n > 1:
			doubled = append(doubled, id)
			if resent[m.UUID] {
				doubledResent++
			}
		}
	}
	t.Logf("%s, WAIT %d: %d payments, %d messages (%d sent again after the failover, the latest finished %v before the kill); deliveries %v; first delivery decided on the new primary %v after the kill; lost %d, doubled %d (%d of them sent again) %v, dead-lettered %d",
		bk.name, wait, failoverMessages, total, len(resent), lastBefore.Round(time.Millisecond), byOutcome, firstAfter.Round(time.Millisecond), len(lost), len(doubled), doubledResent, doubled, len(dead.received()))
	for _, id := range doubled[:min(2, len(doubled))] {
		i, _ := strconv.Atoi(strings.TrimPrefix(id, "p-"))
		t.Logf("%s (times from the kill): %s; ledger %s", id, timelineOf(events, msgs[i].UUID, kill),
			ledgerRows(t, pgx.Identifier{h.ns, "oncemill_ledger"}.Sanitize(), id))
	}
	if sw := g.Switches(); len(sw) != 1 {
		t.Logf("Sentinel's log has %d switches and aborts, not one: %s", len(sw), strings.Join(sw, "; "))
	}
	if len(resent) == 0 {
		t.Errorf("no payment finished in the %v before the kill: the kill did not fall in the flow", failoverResendWindow)
	}
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

// resumeOf is the time from the kill to the first delivery a worker
// decided on the new primary (a payment executed, or a duplicate replayed
// from its record), the earliest of the workers'; each worker must have
// decided one within failoverResume, without a restart. RabbitMQ hands
// each delivery to whichever consumer is free, so a worker may see only
// duplicates after the kill: a replay reads the record from the new
// primary as surely as a claim writes one.
func resumeOf(t *testing.T, workers []*worker, kill time.Time) time.Duration {
	t.Helper()
	var firstAfter time.Duration
	for _, w := range workers {
		var first time.Time
		after := map[string]int{}
		for _, ev := range workerEvents(t, w) {
			if !ev.Time.After(kill) {
				continue
			}
			after[ev.Outcome]++
			if first.IsZero() && (ev.Outcome == "executed" || ev.Outcome == "replayed") {
				first = ev.Time
			}
		}
		switch {
		case first.IsZero():
			t.Errorf("%s decided no delivery after the kill (its deliveries after it: %v); its last log lines:\n%s", w.name, after, w.tailLog(8))
		case first.Sub(kill) > failoverResume:
			t.Errorf("%s decided its first delivery %v after the kill, beyond %v", w.name, first.Sub(kill), failoverResume)
		case firstAfter == 0 || first.Sub(kill) < firstAfter:
			firstAfter = first.Sub(kill)
		}
	}
	return firstAfter
}

// commandMsg is a message to publish again at payment at.
type commandMsg struct {
	at int
	m  *message.Message
}
