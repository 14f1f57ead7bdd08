package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/pipeline"
)

// limit bounds every wait of a scenario: a hang guard, not a speed target.
const limit = 90 * time.Second

// scenarios are the seven ways at-least-once delivery repeats a message,
// each run on every broker with every store (TestScenarios).
var scenarios = []struct {
	name string
	run  func(t *testing.T, h *harness)
}{
	{"1_same_message_twice", sameMessageTwice},
	{"2_same_content_new_uuid", sameContentNewUUID},
	{"3_killed_after_effect_before_ack", killedAfterEffectBeforeAck},
	{"4_transient_error_redelivered", transientErrorRedelivered},
	{"5_permanent_error_dead_lettered_once", permanentErrorDeadLetteredOnce},
	{"6_two_workers_racing_duplicates", twoWorkersRacingDuplicates},
	{"7_killed_before_publishing_produced", killedBeforePublishingProduced},
}

func TestScenarios(t *testing.T) {
	for _, b := range brokerKinds {
		for _, s := range storeKinds {
			t.Run(b.name+"/"+s.name, func(t *testing.T) {
				t.Parallel()
				for _, sc := range scenarios {
					t.Run(sc.name, func(t *testing.T) {
						t.Parallel()
						sc.run(t, newHarness(t, b, s))
					})
				}
			})
		}
	}
}

// 1. The same message (same UUID) twice, keyed by UUID (the soak tool's
// --key=uuid): one effect; the duplicate is replayed, and re-publishes the
// stored settlement under its original UUID. The worker's /readyz, /healthz
// and /metrics answer meanwhile.
func sameMessageTwice(t *testing.T, h *harness) {
	settlements := h.observe(h.settlements())
	w := h.startSoak("worker", "--key=uuid")
	m := newCommand(t, "p-1", 1500, "", 1)
	h.publish(m, again(m))

	eventually(t, limit, func() bool { o := outcomes(w); return o["executed"] == 1 && o["replayed"] == 1 },
		func() string { return "outcomes " + fmtMap(outcomes(w)) })
	eventually(t, limit, func() bool { return len(settlements.received()) == 2 },
		func() string { return fmt.Sprintf("%d settlements received, want 2", len(settlements.received())) })
	got := settlements.received()
	if got[0].UUID != got[1].UUID {
		t.Errorf("settlements %s and %s: the replay must re-publish the original UUID", got[0].UUID, got[1].UUID)
	}

	for _, path := range []string{"/healthz", "/readyz"} {
		if code, body := get(t, w, path); code != 200 {
			t.Errorf("GET %s = %d %q, want 200", path, code, body)
		}
	}
	code, metrics := get(t, w, "/metrics")
	if code != 200 || !strings.Contains(metrics, "oncemill_outcomes") || !strings.Contains(metrics, `outcome="replayed"`) {
		t.Errorf("GET /metrics = %d without oncemill_outcomes{outcome=\"replayed\"}:\n%.2000s", code, metrics)
	}

	w.stop()
	assertLedger(t, h, map[string]int{"p-1": 1})
}

// 2. The same content under a new UUID (a client's retry: new UUID, new
// sent_at and attempt), with the content-hash key (the example worker's):
// one effect.
func sameContentNewUUID(t *testing.T, h *harness) {
	w := h.start("worker")
	first := newCommand(t, "p-1", 1500, "", 1)
	resend := newCommand(t, "p-1", 1500, "", 2)
	if first.UUID == resend.UUID || string(first.Payload) == string(resend.Payload) {
		t.Fatal("the re-send must differ in UUID and envelope")
	}
	h.publish(first, resend)

	eventually(t, limit, func() bool { o := outcomes(w); return o["executed"] == 1 && o["replayed"] == 1 },
		func() string { return "outcomes " + fmtMap(outcomes(w)) })
	w.stop()
	assertLedger(t, h, map[string]int{"p-1": 1})
}

// 3. The worker is killed (SIGKILL) after the effect is recorded and before
// the ack (the soak tool's --hold-before-ack). The broker redelivers to a
// new example worker, which replays the stored outcome instead of running
// the handler again.
func killedAfterEffectBeforeAck(t *testing.T, h *harness) {
	w1 := h.startSoak("worker-1", "--hold-before-ack=p-1")
	m := newCommand(t, "p-1", 1500, "", 1)
	h.publish(m)
	w1.waitLine("hold:", limit)
	assertLedger(t, h, map[string]int{"p-1": 1}) // the effect happened
	w1.kill()

	w2 := h.start("worker-2")
	eventually(t, limit, func() bool { return outcomes(w2)["replayed"] >= 1 },
		func() string { return "worker-2 outcomes " + fmtMap(outcomes(w2)) })
	w2.stop()
	if n := outcomes(w2)["executed"]; n != 0 {
		t.Errorf("worker-2 executed %d deliveries, want 0: the redelivery must be replayed", n)
	}
	assertLedger(t, h, map[string]int{"p-1": 1})
}

// 4. A transient error (the soak tool's gateway times out once on a
// command marked "transient"): the delivery is nacked (the key released),
// the broker redelivers it, and it runs again and succeeds: one effect.
func transientErrorRedelivered(t *testing.T, h *harness) {
	w := h.startSoak("worker")
	h.publish(newCommand(t, "p-1", 1500, "transient", 1))
	eventually(t, limit, func() bool { return outcomes(w)["executed"] == 1 },
		func() string { return "outcomes " + fmtMap(outcomes(w)) })
	w.stop()
	if o := outcomes(w); o["released"] != 1 || o["executed"] != 1 {
		t.Errorf("outcomes %v, want released=1 (the nack) and executed=1 (the redelivery)", o)
	}
	assertLedger(t, h, map[string]int{"p-1": 1})
}

// 5. A permanent error (an invalid amount): the failure is cached and acked,
// the message dead-lettered once; its redelivery is acked from the cache,
// never run, and not dead-lettered again.
func permanentErrorDeadLetteredOnce(t *testing.T, h *harness) {
	dead := h.observe(h.deadLetters())
	w := h.start("worker")
	m := newCommand(t, "p-1", -5, "", 1)
	h.publish(m, again(m))
	eventually(t, limit, func() bool { o := outcomes(w); return o["cached_failure"] == 1 && o["cached_failure_replayed"] == 1 },
		func() string { return "outcomes " + fmtMap(outcomes(w)) })

	// Both deliveries are decided, and a dead letter is published before
	// its delivery is acked. A marker published now is behind anything
	// they forwarded (one partition or queue, in order).
	marker := message.NewMessage(watermill.NewUUID(), []byte("marker"))
	h.publishTo(h.deadLetters(), marker)
	eventually(t, limit, func() bool { return dead.count(marker.UUID) == 1 },
		func() string { return fmt.Sprintf("marker not received; %d dead letters", len(dead.received())) })
	if n := dead.count(m.UUID); n != 1 {
		t.Errorf("%d dead letters of the command, want 1", n)
	}
	for _, d := range dead.received() {
		if d.UUID == m.UUID && pipeline.DeadLetterReason(d.Metadata.Get(pipeline.ReasonKindKey)) != pipeline.DeadLetterReasonCachedFailure {
			t.Errorf("dead letter reason kind %q, want %q", d.Metadata.Get(pipeline.ReasonKindKey), pipeline.DeadLetterReasonCachedFailure)
		}
	}
	w.stop()
	if o := outcomes(w); o["executed"] != 0 || o["released"] != 0 {
		t.Errorf("outcomes %v: the handler must run once and never succeed", o)
	}
	assertLedger(t, h, map[string]int{})
}

// 6. Two worker processes on one queue (or consumer group) get every
// command twice, the copies back to back so they race in the two workers:
// one effect per command. The soak tool's --gateway-latency makes the
// copies overlap in the handlers.
func twoWorkersRacingDuplicates(t *testing.T, h *harness) {
	const n = 12
	extra := []string{"--gateway-latency=100ms"}
	switch h.broker.name {
	case "kafka":
		extra = append(extra, "--kafka-partitions=4") // the two workers share them
	case "nats":
		extra = append(extra, "--nats-max-ack-pending=2") // one in flight per worker
	}
	w1 := h.startSoak("worker-1", extra...)
	w2 := h.startSoak("worker-2", extra...)
	if h.broker.name == "kafka" {
		group := h.ns + "-" + h.payments()
		eventually(t, limit, func() bool { return kafkaGroupReady(t, group, 2) },
			func() string { return "consumer group " + group + " has not assigned partitions to both workers" })
	}
	want := map[string]int{}
	for i := range n {
		id := fmt.Sprintf("p-%d", i+1)
		m := newCommand(t, id, 1500, "", 1)
		h.publish(m, again(m))
		want[id] = 1
	}
	acked := func() int {
		o := outcomes(w1, w2)
		return o["executed"] + o["replayed"]
	}
	eventually(t, limit, func() bool { return acked() == 2*n },
		func() string { return "outcomes " + fmtMap(outcomes(w1, w2)) })
	w1.stop()
	w2.stop()
	if len(w1.events()) == 0 || len(w2.events()) == 0 {
		t.Errorf("worker-1 handled %d deliveries and worker-2 %d: both must take part", len(w1.events()), len(w2.events()))
	}
	assertLedger(t, h, want)
}

// 7. The worker is killed after the handler returned its produced message
// (a settlement) and oncemill stored it, before the router published it
// (the soak tool's --hold-before-ack). After the redelivery to an example
// worker the settlement reaches downstream, with the UUID it was first
// produced under.
func killedBeforePublishingProduced(t *testing.T, h *harness) {
	settlements := h.observe(h.settlements())
	w1 := h.startSoak("worker-1", "--hold-before-ack=p-1")
	h.publish(newCommand(t, "p-1", 1500, "", 1))
	line := w1.waitLine("hold:", limit)
	_, produced, _ := strings.Cut(line, "produced=")
	if produced == "" || strings.Contains(produced, ",") {
		t.Fatalf("hold line %q: want one produced settlement", line)
	}
	w1.kill()

	w2 := h.start("worker-2")
	eventually(t, limit, func() bool { return settlements.count(produced) >= 1 },
		func() string {
			return fmt.Sprintf("settlement %s not received (%d other messages); worker-2 outcomes %v", produced, len(settlements.received()), outcomes(w2))
		})
	w2.stop()
	if o := outcomes(w2); o["executed"] != 0 || o["replayed"] < 1 {
		t.Errorf("worker-2 outcomes %v, want a replay and no execution", o)
	}
	assertLedger(t, h, map[string]int{"p-1": 1})
}

// assertLedger checks the charges per payment.
func assertLedger(t *testing.T, h *harness, want map[string]int) {
	t.Helper()
	got := h.ledger()
	if len(got) != len(want) {
		t.Errorf("ledger %v, want %v", got, want)
		return
	}
	for id, n := range want {
		if got[id] != n {
			t.Errorf("ledger %v, want %v", got, want)
			return
		}
	}
}
