package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// signalingStore closes begun on the first ClaimLease: a delivery is in flight.
type signalingStore struct {
	store.Store
	once  sync.Once
	begun chan struct{}
}

func (s *signalingStore) ClaimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error) {
	s.once.Do(func() { close(s.begun) })
	return s.Store.ClaimLease(ctx, req)
}

// consumeTest is serve over gochannel and the memory store, in a goroutine.
type consumeTest struct {
	t      *testing.T
	b      *Broker
	st     *signalingStore
	ledger *MemoryLedger
	stdout syncBuffer
	logs   syncBuffer
	stop   context.CancelFunc
	done   chan error
}

func startServe(t *testing.T, cfg Config, hooks Hooks) *consumeTest {
	t.Helper()
	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = mem.Close() })
	c := &consumeTest{t: t, st: &signalingStore{Store: mem, begun: make(chan struct{})}, ledger: NewMemoryLedger(), done: make(chan error, 1)}
	ss := &Stores{Store: c.st, Admin: mem, Ledger: c.ledger, Close: func() {}}
	var errs atomic.Int64
	log := NewLogger(cfg.LogLevel, cfg.LogFormat, &c.logs, &errs)
	c.b = newGoChannel(watermill.NewSlogLogger(log))
	t.Cleanup(func() { _ = c.b.Close() })
	tel, err := newTelemetry(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	c.stop = stop
	t.Cleanup(stop)
	go func() { c.done <- serve(ctx, cfg, hooks, log, c.b, ss, tel, &c.stdout) }()
	testenv.WaitFor(t, 30*time.Second, `the worker to print "consuming:"`, func() bool { return strings.Contains(c.stdout.String(), "consuming:") })
	return c
}

func (c *consumeTest) publish(paymentID string) {
	c.t.Helper()
	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"`+paymentID+`","account":"a","amount_cents":100,"currency":"EUR","meta":{}}`))
	if err := c.b.Pub.Publish(Topics{}.Payments(0), msg); err != nil {
		c.t.Fatal(err)
	}
}

// shutdown is SIGTERM: it waits for serve to return.
func (c *consumeTest) shutdown() {
	c.t.Helper()
	c.stop()
	select {
	case err := <-c.done:
		if err != nil {
			c.t.Fatalf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		c.t.Fatal("serve did not return within 30 s of the signal")
	}
}

func consumeConfig() Config {
	cfg := DefaultConfig()
	cfg.Mode, cfg.Broker, cfg.Partitions, cfg.Lease = "consume", "kafka", 1, 2*time.Second
	cfg.ApplyModeDefaults(map[string]bool{})
	cfg.DrainTimeout = 10 * time.Second
	cfg.HTTPAddr = "127.0.0.1:0"
	return cfg
}

// On SIGTERM (here: ctx canceled) the consumer drains: a delivery in flight
// finishes, takes effect once and is recorded before serve returns.
func TestServeDrainsInFlightMessagesOnShutdown(t *testing.T) {
	// The delivery is still running when the signal comes.
	slow := func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			time.Sleep(300 * time.Millisecond)
			return h(msg)
		}
	}
	c := startServe(t, consumeConfig(), Hooks{Inner: []message.HandlerMiddleware{slow}})
	c.publish("p-1")
	<-c.st.begun
	c.shutdown()

	counts, _ := c.ledger.Counts(context.Background(), "payments")
	if counts["p-1"] != 1 {
		t.Errorf("ledger %v: the delivery in flight must finish during the drain", counts)
	}
	if !strings.Contains(c.stdout.String(), "consumed: deliveries=1 executed=1\n") {
		t.Errorf("stdout %q: want the delivery executed and counted", c.stdout.String())
	}
}

// The consume mode logs its progress every --progress, as a JSON record,
// with durations as strings.
func TestServeLogsProgress(t *testing.T) {
	cfg := consumeConfig()
	cfg.Progress = 20 * time.Millisecond
	c := startServe(t, cfg, Hooks{})
	c.publish("p-1")
	c.publish("p-2")
	testenv.WaitFor(t, 30*time.Second, "a log line with \"executed\":2", func() bool { return strings.Contains(c.logs.String(), `"executed":2`) })
	c.shutdown()

	var progress, draining map[string]any
	for _, line := range strings.Split(strings.TrimSpace(c.logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %q is not JSON: %v", line, err)
		}
		switch rec["msg"] {
		case "Progress":
			progress = rec
		case "Draining the messages in flight":
			draining = rec
		}
	}
	if progress == nil || progress["deliveries"] != 2.0 || progress["executed"] != 2.0 || progress["replayed"] != 0.0 {
		t.Errorf("last progress record %v: want deliveries=2 executed=2 replayed=0", progress)
	}
	if draining["timeout"] != "10s" {
		t.Errorf("drain record %v: want timeout \"10s\"", draining)
	}
}

func TestConsumeModeDefaults(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Mode = "consume"
	cfg.ApplyModeDefaults(map[string]bool{})
	if cfg.LogLevel != "info" || cfg.LogFormat != "json" || cfg.HTTPAddr != ":8080" || cfg.Progress != 10*time.Second {
		t.Errorf("consume mode: log %s/%s http %q progress %v, want info/json, :8080 and 10s", cfg.LogLevel, cfg.LogFormat, cfg.HTTPAddr, cfg.Progress)
	}
	cfg = DefaultConfig()
	cfg.Mode, cfg.LogLevel, cfg.HTTPAddr, cfg.Progress = "consume", "error", "", time.Second
	cfg.ApplyModeDefaults(map[string]bool{"log-level": true, "http-addr": true, "progress": true})
	if cfg.LogLevel != "error" || cfg.HTTPAddr != "" || cfg.Progress != time.Second {
		t.Errorf("flags set explicitly must win: log %s http %q progress %v", cfg.LogLevel, cfg.HTTPAddr, cfg.Progress)
	}
	cfg = DefaultConfig()
	cfg.Store = "redis"
	cfg.ApplyModeDefaults(map[string]bool{})
	if cfg.InFlight != 32 {
		t.Errorf("run mode on a shared store: inflight %d, want 32", cfg.InFlight)
	}
}

// syncBuffer is a bytes.Buffer safe for concurrent writers and a reader.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

var _ io.Writer = (*syncBuffer)(nil)
