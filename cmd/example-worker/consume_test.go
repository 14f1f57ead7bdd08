package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// signalingStore closes begun on the first Begin: a delivery is in flight.
type signalingStore struct {
	store.Store
	once  sync.Once
	begun chan struct{}
}

func (s *signalingStore) Begin(ctx context.Context, req store.BeginRequest) (store.BeginResult, error) {
	s.once.Do(func() { close(s.begun) })
	return s.Store.Begin(ctx, req)
}

// On SIGTERM (here: ctx canceled) the consumer drains: a delivery in flight
// finishes, takes effect once and is recorded before serve returns.
func TestServeDrainsInFlightMessagesOnShutdown(t *testing.T) {
	cfg := defaultConfig()
	cfg.Mode, cfg.Partitions, cfg.Lease = "consume", 1, 2*time.Second
	cfg.GatewayLatency = 300 * time.Millisecond // the delivery is still running when the signal comes
	cfg.DrainTimeout = 10 * time.Second
	cfg.HTTPAddr = "127.0.0.1:0"

	mem, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	st := &signalingStore{Store: mem, begun: make(chan struct{})}
	led := newMemoryLedger()
	ss := &storeSetup{store: st, ledger: led, close: func() {}}
	var errs atomic.Int64
	log := newLogger("off", "json", io.Discard, &errs)
	b := newGoChannel(watermill.NewSlogLogger(log))
	defer b.close()
	tel, err := newTelemetry(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	var stdout syncBuffer
	done := make(chan error, 1)
	go func() { done <- serve(ctx, cfg, log, b, ss, tel, &stdout) }()
	waitFor(t, func() bool { return strings.Contains(stdout.String(), "consuming:") })

	msg := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"p-1","account":"a","amount_cents":100,"currency":"EUR","meta":{}}`))
	if err := b.pub.Publish(topics{}.payments(0), msg); err != nil {
		t.Fatal(err)
	}
	<-st.begun
	stop() // the signal, while the handler waits on the gateway

	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("serve: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("serve did not return within 30 s of the signal")
	}
	counts, _ := led.counts(context.Background(), cfg.Scope)
	if counts["p-1"] != 1 {
		t.Errorf("ledger %v: the delivery in flight must finish during the drain", counts)
	}
	if !strings.Contains(stdout.String(), "consumed: executed=1 ") {
		t.Errorf("stdout %q: want the delivery executed and counted", stdout.String())
	}
}

func TestConsumeModeDefaults(t *testing.T) {
	cfg, err := parseFlags([]string{"--mode=consume", "--broker=kafka", "--partitions=1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LogLevel != "info" || cfg.LogFormat != "json" || cfg.HTTPAddr != ":8080" {
		t.Errorf("consume mode: log %s/%s http %q, want info/json and :8080", cfg.LogLevel, cfg.LogFormat, cfg.HTTPAddr)
	}
	cfg, err = parseFlags([]string{"--mode=consume", "--broker=sqs", "--log-level=error", "--http-addr="}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LogLevel != "error" || cfg.HTTPAddr != "" {
		t.Errorf("flags set explicitly must win: log %s http %q", cfg.LogLevel, cfg.HTTPAddr)
	}
	cfg, err = parseFlags([]string{"--store=redis"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.InFlight != 32 {
		t.Errorf("run mode on a shared store: inflight %d, want 32", cfg.InFlight)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 30 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// syncBuffer is a bytes.Buffer safe for one writer and one reader.
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

// The run ends only once every publication is acked and no handler still
// runs: a broker's own redelivery (an SQS visibility timeout running out
// while the handler stalls) is acked as well, and used to end the run
// before the stalled handler had charged its payment.
func TestTrackerIgnoresBrokerRedeliveriesAndWaitsForRunningHandlers(t *testing.T) {
	tr := newTracker(1)
	tr.publishing(0, "a")
	release := make(chan struct{})
	var calls atomic.Int32
	h := tr.middleware(0)(func(*message.Message) ([]*message.Message, error) {
		if calls.Add(1) == 1 { // the stalled first delivery
			<-release
		}
		return nil, nil
	})
	stalled := make(chan struct{})
	go func() { _, _ = h(message.NewMessage("a", nil)); close(stalled) }()
	waitFor(t, func() bool { tr.mu.Lock(); defer tr.mu.Unlock(); return tr.running == 1 })
	if _, err := h(message.NewMessage("a", nil)); err != nil {
		t.Fatal(err)
	}
	tr.mu.Lock()
	doneEarly := tr.done(1)
	tr.mu.Unlock()
	if doneEarly {
		t.Fatal("the run would end while the first delivery still runs")
	}
	close(release)
	<-stalled
	fs := tr.state()
	if fs.acked != 1 || fs.extraAcks != 1 || fs.inFlight != 0 {
		t.Fatalf("acked %d, extra %d, in flight %d; want 1, 1, 0", fs.acked, fs.extraAcks, fs.inFlight)
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if !tr.done(1) {
		t.Fatal("the run does not end once every publication is acked and nothing runs")
	}
}
