package integration

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// A Kafka consumer group keeps making progress while its workers are
// SIGKILLed every 1–3 s and replaced. With sarama's default rebalance
// timeout (60 s, longer than its 30 s network read timeout) a group on kfake
// made no progress for minutes under such churn; the example worker bounds
// the rebalance by the session timeout (internal/worker/kafka.go,
// docs/kafka.md). Every payment is charged exactly once in the end: the
// store is PostgreSQL, whose one-transaction mode commits the charge with the
// record. (The lease mode on Redis re-runs a handler killed between its
// effect and the record, as docs/design.md says, so random kills would
// rightly charge a payment twice now and then.)
func TestKafkaGroupProgressesWhileWorkersCrash(t *testing.T) {
	h := newHarness(t, brokerKinds[0], storeKinds[0]) // kafka, postgres
	const payments, workers = 300, 3
	start := func(i int) *worker { return h.start(fmt.Sprintf("worker-%d", i), "--kafka-partitions=3") }
	running := make([]*worker, workers)
	for i := range running {
		running[i] = start(i)
	}
	want := map[string]int{}
	publish := func(n int) {
		for range n {
			id := fmt.Sprintf("p-%d", len(want))
			want[id] = 1
			h.publish(newCommand(t, id, 1500, "", 1))
		}
	}
	// Payments keep arriving while a worker is killed and replaced every
	// 1–3 s, so that every rebalance has work waiting behind it.
	churnUntil := time.Now().Add(15 * time.Second)
	next := workers
	for time.Now().Before(churnUntil) {
		publish(payments / 10)
		time.Sleep(time.Second + rand.N(2*time.Second))
		i := rand.IntN(workers)
		running[i].kill()
		running[i] = start(next)
		next++
	}
	publish(payments / 10)
	eventually(t, limit, func() bool { return len(h.ledger()) == len(want) },
		func() string {
			return fmt.Sprintf("%d of %d payments charged after %d kills", len(h.ledger()), len(want), next-workers)
		})
	assertLedger(t, h, want)
	t.Logf("%d kills, %d payments; every payment charged once", next-workers, len(want))
}
