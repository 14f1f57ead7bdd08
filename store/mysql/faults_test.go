package mysql_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/mysql"
)

// The fault suite puts a toxiproxy proxy, in process, between the pipeline
// and MariaDB, and delivers messages in the one-transaction mode the way a
// broker that requeues a nack at once does (RabbitMQ), while the proxy
// cuts, stalls or slows the store's connections. Every message must end
// acked and charged exactly once: the charge is a row the handler writes
// in the claim's transaction.

// storeFault is one way the network misbehaves, for how long.
type storeFault struct {
	name  string
	lasts time.Duration
	apply func(t *testing.T, p *toxiproxy.Proxy) (heal func())
	// nacks: the fault fails deliveries (a cut, a stall), rather than
	// slowing them.
	nacks bool
}

var storeFaults = []storeFault{
	{"cut", 4 * time.Second, func(t *testing.T, p *toxiproxy.Proxy) func() {
		p.Stop() // every connection dropped, new ones refused
		return func() {
			if err := p.Start(); err != nil {
				t.Error(err)
			}
		}
	}, true},
	{"stall", 3 * time.Second, func(t *testing.T, p *toxiproxy.Proxy) func() {
		stall(t, p)
		return func() {
			if err := p.Toxics.RemoveToxic(context.Background(), "stall"); err != nil {
				t.Error(err)
			}
		}
	}, true},
	{"latency 50-200ms", 4 * time.Second, func(t *testing.T, p *toxiproxy.Proxy) func() {
		if _, err := p.Toxics.AddToxicJson(strings.NewReader(`{"name":"slow","type":"latency","stream":"downstream","toxicity":1,"attributes":{"latency":125,"jitter":75}}`)); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := p.Toxics.RemoveToxic(context.Background(), "slow"); err != nil {
				t.Error(err)
			}
		}
	}, false},
}

// Messages arrive every faultSpacing over faultMessages × faultSpacing =
// 6 s; the fault starts faultLead after the first.
const (
	faultMessages = 300
	faultSpacing  = 20 * time.Millisecond
	faultLead     = 500 * time.Millisecond
)

func TestStoreFaults(t *testing.T) {
	t.Parallel()
	for _, f := range storeFaults {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			runStoreFault(t, f)
		})
	}
}

func runStoreFault(t *testing.T, f storeFault) {
	dsn := testenv.MariaDBDatabase(t)
	direct := testenv.MariaDB(t, dsn)
	newStore(t, direct, mysql.Options{})
	if _, err := direct.ExecContext(t.Context(), "CREATE TABLE ledger (id BIGINT AUTO_INCREMENT PRIMARY KEY, uuid VARCHAR(64) NOT NULL)"); err != nil {
		t.Fatal(err) // no unique key: a double effect would show
	}
	p, db := proxied(t, dsn, 16)
	st, err := mysql.New(db, mysql.Options{StatementTimeout: 500 * time.Millisecond, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rc, err := receiver.NewTransactional(st).WithScope("faults").
		WithPolicy(policy.Policy{NackDelay: 50 * time.Millisecond, MaxAttempts: 1 << 20}). // faults are not the handler's failures
		Build()
	if err != nil {
		t.Fatal(err)
	}
	h := rc.Middleware(func(m *message.Message) ([]*message.Message, error) {
		time.Sleep(20 * time.Millisecond) // the fault finds handlers at work
		tx, _ := mysql.TxFromContext(m.Context())
		_, err := tx.ExecContext(m.Context(), "INSERT INTO ledger (uuid) VALUES (?)", m.UUID)
		return nil, err
	})

	queue := make(chan string, faultMessages)
	go func() {
		for i := range faultMessages {
			queue <- fmt.Sprintf("m-%d", i)
			time.Sleep(faultSpacing)
		}
	}()
	var acked, nacks atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case id := <-queue:
					if _, err := h(message.NewMessage(id, []byte("pay"))); err != nil {
						nacks.Add(1)
						queue <- id // requeued at once, as RabbitMQ does
						continue
					}
					if acked.Add(1) == faultMessages {
						close(done)
					}
				}
			}
		})
	}
	time.Sleep(faultLead)
	heal := f.apply(t, p)
	time.Sleep(f.lasts)
	heal()
	testenv.WaitFor(t, 2*time.Minute, "every message to be acked", func() bool { return acked.Load() >= faultMessages })
	wg.Wait()

	rows, err := direct.QueryContext(t.Context(), "SELECT uuid, COUNT(*) FROM ledger GROUP BY uuid")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	effects := map[string]int{}
	for rows.Next() {
		var id string
		var n int
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		effects[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	lost, doubles := 0, 0
	for i := range faultMessages {
		switch n := effects[fmt.Sprintf("m-%d", i)]; {
		case n == 0:
			lost++
		case n > 1:
			doubles++
		}
	}
	t.Logf("%s: %d acked, %d nacked, %d charged, %d lost, %d doubled", f.name, acked.Load(), nacks.Load(), len(effects), lost, doubles)
	if lost != 0 || doubles != 0 {
		t.Errorf("%d lost, %d doubled", lost, doubles)
	}
	if f.nacks && nacks.Load() == 0 {
		t.Errorf("no delivery was nacked during the %s: the fault did not reach the store", f.name)
	}
}
