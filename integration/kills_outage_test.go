package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	rig "github.com/oncemill/oncemill/integration/internal/worker"
	"github.com/oncemill/oncemill/pipeline"
)

// TestKillsAndOutageDeadLetterNothing: the
// pause between attempts belongs to the store, so a message handed to
// another consumer by a kill, a rebalance or a requeue still waits it out,
// and the default five attempts span the schedule (3, 6, 12, 24 s)
// whichever consumer runs them.
//
// Three workers of the rig run the lease mode with the records in Redis
// (--store=redis) and the ledger, the handler's side effect, in PostgreSQL
// (--ledger=postgres) through a toxiproxy proxy; each worker consumes three
// payments topics (--partitions=3; on Kafka each of three partitions). One
// worker is SIGKILLed every 1–3 s and replaced, from the first payment
// until killsAfterHeal after the heal, and the proxy is cut for killsCut in
// the middle of the flow. The policy is the rig's, with the default attempt
// schedule (no WithRetry), and the workers dead-letter. A SIGKILL between a
// charge and its record re-runs the handler at attempt n+1 (a takeover);
// the ledger books on attempt 2 and later only if no earlier attempt did
// (internal/worker/ledger_postgres.go, as docs/operations.md advises), and
// its table has no unique constraint, so a double is a second row.
//
// Before the store kept the pause, this dead-lettered 4–5 of 3,000
// messages on Kafka and 1 on RabbitMQ: the consumer a message was handed to
// started the next attempt at once. Now every payment must be charged
// exactly once and none dead-lettered. The test logs the highest attempt
// any delivery ran, the time from the heal until every payment was
// charged, and the executed deliveries whose payment an earlier attempt
// had charged (the doubles the attempt check kept out). A delivery's log
// line comes at its end: a released one's after the pause, so the
// attempts of a worker killed in the pause are not in any log.
func TestKillsAndOutageDeadLetterNothing(t *testing.T) {
	for _, c := range []struct{ name, kind string }{{"kafka", "kafka"}, {"rabbitmq", "amqp-v3"}} {
		t.Run(c.name, func(t *testing.T) {
			var bk brokerKind
			for _, b := range brokerKinds {
				if b.name == c.kind {
					bk = b
				}
			}
			if bk.name == "" {
				t.Fatalf("no broker kind %q in brokerKinds", c.kind)
			}
			runKillsAndOutage(t, bk)
		})
	}
}

const (
	killsPayments   = 3000
	killsWorkers    = 3
	killsTopics     = 3 // --partitions: payments topics, and consumers, per worker
	killsPublishFor = 30 * time.Second
	killsCutAt      = 12 * time.Second // after the first payment
	killsCut        = 10 * time.Second
	killsAfterHeal  = 10 * time.Second
	// killsLiveness bounds the wait, after the kills end, until every
	// payment is charged: a hang guard. The longest pause of the schedule
	// is 24 s.
	killsLiveness = 2 * time.Minute
)

// killsEvent is one "delivery" line of a worker's log.
type killsEvent struct {
	Time        time.Time `json:"time"`
	Msg         string    `json:"msg"`
	Outcome     string    `json:"outcome"`
	MessageUUID string    `json:"message_uuid"`
	Key         string    `json:"key"`
	Attempt     int       `json:"attempt"`
	Token       int64     `json:"token"`
	Takeover    bool      `json:"takeover"`
	Error       string    `json:"error"`
	worker      string
}

func runKillsAndOutage(t *testing.T, bk brokerKind) {
	h := newHarness(t, bk, storeKindNamed(t, "redis"))
	topics := make([]string, killsTopics)
	for i := range topics {
		topics[i] = fmt.Sprintf("%s-payments-%d", h.ns, i)
	}
	t.Cleanup(func() {
		bk.cleanup(t, topics[1:]) // the harness removes payments-0
		storeKindNamed(t, "postgres").cleanup(t, h.ns)
	})
	ledgerKind := storeKindNamed(t, "postgres")

	proxy := faultProxy(t, pgUpstream(t))
	u, err := url.Parse(env.postgresDSN)
	must(t, err)
	u.Host = proxy.Listen
	q := u.Query()
	q.Set("connect_timeout", "2")
	u.RawQuery = q.Encode()
	args := []string{"--ledger=postgres", "--ledger-postgres-dsn=" + u.String(), "--postgres-schema=" + h.ns,
		fmt.Sprintf("--partitions=%d", killsTopics)}
	if bk.name == "kafka" {
		args = append(args, fmt.Sprintf("--kafka-partitions=%d", killsTopics))
	}
	var all []*worker // every worker started, killed or not: their logs
	next := 0
	start := func() *worker {
		w := h.start(fmt.Sprintf("worker-%d", next), args...)
		next++
		all = append(all, w)
		return w
	}
	running := make([]*worker, killsWorkers)
	for i := range running {
		running[i] = start()
	}
	dead := h.observe(h.deadLetters())

	// The ledger, read directly (not through the proxy): when every
	// payment first had a charge.
	pool := pgPool(t)
	table := pgx.Identifier{h.ns, "oncemill_ledger"}.Sanitize()
	var allChargedAt atomic.Pointer[time.Time]
	allCharged := make(chan struct{})
	var charged atomic.Int64
	sampleCtx, stopSampling := context.WithCancel(context.Background())
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			var n int64
			if err := pool.QueryRow(sampleCtx, "SELECT count(DISTINCT payment_id) FROM "+table+" WHERE scope = $1", scope).Scan(&n); err == nil {
				charged.Store(n)
				if n >= killsPayments {
					now := time.Now()
					allChargedAt.Store(&now)
					close(allCharged)
					return
				}
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { stopSampling(); <-sampled }()

	// The payments, killsPayments/killsPublishFor a second, round robin
	// over the topics.
	msgs := payments(t, killsPayments)
	uuids := make([]string, killsPayments) // payment i's message
	for i, m := range msgs {
		uuids[i] = m.UUID
	}
	begin := time.Now()
	published := h.publishPaced(msgs, 300, killsPublishFor, func(i int) string { return topics[i%killsTopics] }, nil)

	// The cut, in the middle of the flow.
	var cutAt, healAt atomic.Pointer[time.Time]
	var chargedAtCut, chargedAtHeal atomic.Int64
	cutDone := make(chan struct{})
	go func() {
		defer close(cutDone)
		time.Sleep(time.Until(begin.Add(killsCutAt)))
		proxy.Stop() // every connection dropped, new ones refused
		cut := time.Now()
		cutAt.Store(&cut)
		// A second for the statements the cut met in the server.
		time.Sleep(time.Second)
		chargedAtCut.Store(countCharged(t, table))
		time.Sleep(time.Until(cut.Add(killsCut)))
		chargedAtHeal.Store(countCharged(t, table))
		if err := proxy.Start(); err != nil {
			t.Errorf("healing the proxy: %v", err)
		}
		healed := time.Now()
		healAt.Store(&healed)
	}()

	// The kills: one every 1–3 s, each worker replaced at once (the
	// workers start while the ledger's database is cut), until
	// killsAfterHeal after the heal.
	kills := 0
	killLimit := time.Now().Add(limit)
	for {
		if healed := healAt.Load(); healed != nil && time.Since(*healed) > killsAfterHeal {
			break
		}
		if time.Now().After(killLimit) {
			t.Fatalf("the proxy was not healed %v after the first payment", limit)
		}
		time.Sleep(time.Second + rand.N(2*time.Second))
		i := rand.IntN(killsWorkers)
		running[i].kill()
		kills++
		running[i] = start()
	}
	<-published
	<-cutDone
	heal := *healAt.Load()
	t.Logf("%d kills; the cut began %v after the first payment; %d payments charged 1 s into the cut, %d at its end",
		kills, cutAt.Load().Sub(begin).Round(time.Millisecond), chargedAtCut.Load(), chargedAtHeal.Load())
	if chargedAtCut.Load() >= killsPayments/2 || chargedAtHeal.Load() != chargedAtCut.Load() {
		t.Errorf("the cut did not cut the ledger in the middle of the flow: %d payments charged 1 s into it, %d at its end",
			chargedAtCut.Load(), chargedAtHeal.Load())
	}

	// Every payment charged, or as many as the dead letters leave.
	deadPayments := func() map[string]bool {
		out := map[string]bool{}
		for _, m := range dead.received() {
			var c command
			if json.Unmarshal(m.Payload, &c) == nil {
				out[c.PaymentID] = true
			}
		}
		return out
	}
	var healToCharged time.Duration
	deadline := time.NewTimer(killsLiveness)
	defer deadline.Stop()
	poll := time.NewTicker(500 * time.Millisecond)
	defer poll.Stop()
wait:
	for {
		select {
		case <-allCharged:
			healToCharged = allChargedAt.Load().Sub(heal)
			break wait
		case <-poll.C:
			if d := len(deadPayments()); d > 0 && charged.Load()+int64(d) >= killsPayments {
				t.Errorf("%d payments charged and %d dead-lettered", charged.Load(), d)
				break wait
			}
		case <-deadline.C:
			t.Errorf("%d of %d payments charged %v after the kills ended (%v after the heal)",
				charged.Load(), killsPayments, killsLiveness, time.Since(heal).Round(time.Second))
			break wait
		}
	}
	// A dead letter still on its way: a moment for it, then the workers stop.
	time.Sleep(2 * time.Second)
	for _, w := range running {
		w.kill()
	}

	// The ledger: one charge per payment.
	counts := ledgerKind.ledger(t, h.ns, scope)
	var lost, doubled []string
	for i := range killsPayments {
		id := fmt.Sprintf("p-%d", i)
		switch n := counts[id]; {
		case n == 0:
			lost = append(lost, id)
		case n > 1:
			doubled = append(doubled, id)
		}
	}

	// What the workers decided, from their logs.
	var events []killsEvent
	for _, w := range all {
		events = append(events, workerEvents(t, w)...)
	}
	sort.Slice(events, func(i, j int) bool { return events[i].Time.Before(events[j].Time) })
	byOutcome := map[string]int{}
	takeovers, maxAttempt := 0, 0
	var maxAttemptMsg string
	for _, ev := range events {
		byOutcome[ev.Outcome]++
		if ev.Takeover {
			takeovers++
		}
		switch ev.Outcome {
		case "executed", "released", "cached_failure":
			if ev.Attempt > maxAttempt {
				maxAttempt, maxAttemptMsg = ev.Attempt, ev.MessageUUID
			}
		}
	}
	exhausted := 0
	for _, ev := range events {
		if ev.Outcome == "cached_failure" {
			exhausted++
		}
	}
	deadSet := deadPayments()

	// The charges the attempt check kept from doubling: an executed
	// delivery at attempt n > 1 whose payment's only row is of an earlier
	// attempt (the charge of a delivery killed, or cut off, before its
	// record).
	firstAttempt := map[string]int{} // payment_id -> the attempt of its row
	rows, err := pool.Query(context.Background(), "SELECT payment_id, min(attempt) FROM "+table+" WHERE scope = $1 GROUP BY payment_id", scope)
	must(t, err)
	var pid string
	var att int
	_, err = pgx.ForEachRow(rows, []any{&pid, &att}, func() error { firstAttempt[pid] = att; return nil })
	must(t, err)
	payment := make(map[string]string, killsPayments) // message uuid -> payment_id
	for i, u := range uuids {
		payment[u] = fmt.Sprintf("p-%d", i)
	}
	var kept []string
	for _, ev := range events {
		if ev.Outcome == "executed" && ev.Attempt > 1 {
			if a, ok := firstAttempt[payment[ev.MessageUUID]]; ok && a < ev.Attempt {
				kept = append(kept, fmt.Sprintf("%s (row of attempt %d, executed at attempt %d%s)",
					payment[ev.MessageUUID], a, ev.Attempt, map[bool]string{true: ", a takeover"}[ev.Takeover]))
			}
		}
	}
	t.Logf("%d executed deliveries found their payment charged by an earlier attempt and booked nothing: %s", len(kept), strings.Join(kept, "; "))

	t.Logf("%s: %d payments, %d workers started, %d kills, cut %v; %d deliveries %v, %d takeovers; highest attempt %d (message %.8s); all charged %v after the heal; lost %d, doubled %d, dead-lettered %d (%d cached failures logged)",
		bk.name, killsPayments, len(all), kills, killsCut, len(events), byOutcome, takeovers, maxAttempt, maxAttemptMsg,
		healToCharged.Round(100*time.Millisecond), len(lost), len(doubled), len(deadSet), exhausted)
	if maxAttemptMsg != "" {
		t.Logf("the highest attempt's message: %s", timelineOf(events, maxAttemptMsg, heal))
	}

	if len(lost) > 0 {
		t.Errorf("%d of %d payments have no charge (lost), e.g. %s", len(lost), killsPayments, strings.Join(lost[:min(5, len(lost))], ", "))
		for _, id := range lost[:min(5, len(lost))] {
			var i int
			_, _ = fmt.Sscanf(id, "p-%d", &i)
			t.Logf("lost %s (message %s): %s", id, uuids[i], timelineOf(events, uuids[i], heal))
		}
	}
	if len(doubled) > 0 {
		t.Errorf("%d payments charged more than once, e.g. %s", len(doubled), strings.Join(doubled[:min(5, len(doubled))], ", "))
		for _, id := range doubled[:min(5, len(doubled))] {
			t.Logf("doubled %s: %s", id, ledgerRows(t, table, id))
			var i int
			_, _ = fmt.Sscanf(id, "p-%d", &i)
			t.Logf("doubled %s (message %s): %s", id, uuids[i], timelineOf(events, uuids[i], heal))
		}
	}
	if len(deadSet) > 0 || exhausted > 0 {
		t.Errorf("%d payments dead-lettered, %d cached failures logged; want none", len(deadSet), exhausted)
		for _, m := range dead.received() {
			t.Logf("dead letter %s (%s=%s, %s=%s): %s", m.UUID, pipeline.ReasonKindKey, m.Metadata.Get(pipeline.ReasonKindKey),
				pipeline.AttemptKey, m.Metadata.Get(pipeline.AttemptKey), timelineOf(events, m.UUID, heal))
		}
	}
}

// countCharged is the number of payments with a charge, read directly.
func countCharged(t *testing.T, table string) int64 {
	var n int64
	if err := pgPool(t).QueryRow(context.Background(), "SELECT count(DISTINCT payment_id) FROM "+table+" WHERE scope = $1", scope).Scan(&n); err != nil {
		t.Errorf("counting the charges: %v", err)
	}
	return n
}

// workerEvents reads the delivery lines of w's log.
func workerEvents(t *testing.T, w *worker) []killsEvent {
	data, err := os.ReadFile(w.logs)
	if err != nil {
		t.Fatal(err)
	}
	var out []killsEvent
	for _, line := range bytes.Split(data, []byte("\n")) {
		var ev killsEvent
		if json.Unmarshal(line, &ev) == nil && ev.Msg == "delivery" {
			ev.worker = w.name
			out = append(out, ev)
		}
	}
	return out
}

// timelineOf lists the deliveries of message uuid, and of every message of
// its key, with their times relative to the heal.
func timelineOf(events []killsEvent, uuid string, heal time.Time) string {
	key := ""
	for _, ev := range events {
		if ev.MessageUUID == uuid && ev.Key != "" {
			key = ev.Key
			break
		}
	}
	var parts []string
	for _, ev := range events {
		if ev.MessageUUID != uuid && (key == "" || ev.Key != key) {
			continue
		}
		s := fmt.Sprintf("%+.2fs %s %s attempt %d token %d", ev.Time.Sub(heal).Seconds(), ev.worker, ev.Outcome, ev.Attempt, ev.Token)
		if ev.Takeover {
			s += " takeover"
		}
		if ev.Error != "" {
			s += " (" + ev.Error + ")"
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "no deliveries logged"
	}
	return "times from the heal: " + strings.Join(parts, "; ")
}

// ledgerRows describes the ledger rows of a payment.
func ledgerRows(t *testing.T, table, paymentID string) string {
	rows, err := pgPool(t).Query(context.Background(),
		"SELECT message_uuid, fencing_token, attempt, charged_at FROM "+table+" WHERE scope = $1 AND payment_id = $2 ORDER BY id", scope, paymentID)
	if err != nil {
		return err.Error()
	}
	var parts []string
	var uuid string
	var token int64
	var attempt int
	var at time.Time
	_, err = pgx.ForEachRow(rows, []any{&uuid, &token, &attempt, &at}, func() error {
		parts = append(parts, fmt.Sprintf("%.8s token %d attempt %d at %s", uuid, token, attempt, at.Format("15:04:05.000")))
		return nil
	})
	if err != nil {
		return err.Error()
	}
	return strings.Join(parts, "; ")
}

// The worker's --ledger=postgres books a charge on attempt 2 and later
// only if no earlier attempt booked the payment, and books every first
// attempt: the check keeps a re-run (a takeover after a SIGKILL between
// the charge and the record, a retry after a lost reply) from doubling,
// and hides no real double, since the table has no unique constraint.
func TestLedgerPostgresBooksALaterAttemptOnce(t *testing.T) {
	ns := fmt.Sprintf("it_ledger_%d", time.Now().UnixNano())
	t.Cleanup(func() { storeKindNamed(t, "postgres").cleanup(t, ns) })
	cfg := rig.DefaultConfig()
	cfg.Store, cfg.Ledger, cfg.LedgerPostgresDSN, cfg.PGSchema = "memory", "postgres", env.postgresDSN, ns
	must(t, cfg.Validate())
	ctx := context.Background()
	ss, err := rig.OpenStore(ctx, cfg, slog.New(slog.DiscardHandler))
	must(t, err)
	defer ss.Close()
	charge := func(id string, attempt int) {
		t.Helper()
		must(t, ss.Ledger.Charge(ctx, rig.Charge{Scope: scope, PaymentID: id, MessageUUID: "m-" + id, Token: int64(attempt), Attempt: attempt}))
	}
	charge("p-1", 1)
	charge("p-1", 2) // a takeover: p-1 is booked
	charge("p-1", 3)
	charge("p-2", 2) // a retry whose first attempt booked nothing
	charge("p-3", 1)
	charge("p-3", 1) // two first attempts: a real double, shown
	got := storeKindNamed(t, "postgres").ledger(t, ns, scope)
	if want := map[string]int{"p-1": 1, "p-2": 1, "p-3": 2}; fmtMap(got) != fmtMap(want) {
		t.Errorf("ledger %v, want %v", got, want)
	}
}
