package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
)

// syncBuffer is a bytes.Buffer the worker writes while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !ok(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// The deployable worker, over gochannel (which the flags refuse for
// consume: nothing outside the process could reach it) and the memory
// store: it serves its probes and metrics, charges a payment delivered
// twice once, caches an invalid one, and returns when its context ends
// (SIGTERM) after printing what it consumed.
func TestConsumeServesProbesAndDrains(t *testing.T) {
	cfg, err := parseFlags([]string{"--partitions=1", "--http-addr=127.0.0.1:0"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	cfg.mode = "consume"
	w, err := open(context.Background(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer w.close()
	ctx, sigterm := context.WithCancel(context.Background())
	defer sigterm()
	var stdout syncBuffer
	done := make(chan error, 1)
	go func() { done <- w.consume(ctx, &stdout) }()
	waitFor(t, `"consuming:"`, func() bool { return strings.Contains(stdout.String(), "consuming: payments-0 to payments-0") })
	addr := regexp.MustCompile(`listening: (http://\S+)`).FindStringSubmatch(stdout.String())
	if addr == nil {
		t.Fatalf("no listening: line in %q", stdout.String())
	}
	if code, body := get(t, addr[1]+"/healthz"); code != http.StatusOK || body != "ok\n" {
		t.Errorf("/healthz: %d %q", code, body)
	}
	if code, body := get(t, addr[1]+"/readyz"); code != http.StatusOK || body != "ready\n" {
		t.Errorf("/readyz: %d %q", code, body)
	}

	paid := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"p-1","account":"a","amount_cents":100,"currency":"EUR","meta":{}}`))
	invalid := message.NewMessage(watermill.NewUUID(), []byte(`{"payment_id":"p-2","account":"a","amount_cents":0,"currency":"EUR","meta":{}}`))
	for _, msg := range []*message.Message{paid, message.NewMessage(paid.UUID, paid.Payload), invalid} {
		if err := w.broker.pub.Publish("payments-0", msg); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "three deliveries", func() bool {
		_, metrics := get(t, addr[1]+"/metrics")
		return strings.Count(metrics, "oncemill_outcomes") > 2 && strings.Contains(metrics, `outcome="replayed"`) && strings.Contains(metrics, `outcome="cached_failure"`)
	})
	counts, err := w.stores.counts(context.Background())
	if err != nil || len(counts) != 1 || counts["p-1"] != 1 {
		t.Errorf("ledger %v (%v), want p-1 charged once and nothing else", counts, err)
	}

	sigterm()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("consume: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("consume did not return after SIGTERM")
	}
	if !strings.HasSuffix(stdout.String(), "consumed: deliveries=3\n") {
		t.Errorf("stdout does not end with the consumed line:\n%s", stdout.String())
	}
}
