package main

import (
	"bytes"
	"crypto/rand"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// The demo on NATS JetStream (127.0.0.1:4222, or $ONCEMILL_NATS_URL): every
// payment charged once through streams and durable consumers of its own,
// which the test removes.
func TestDemoOnNATS(t *testing.T) {
	cfg, err := parseFlags(nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(cfg.natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("NATS at %s is unreachable: %v", cfg.natsURL, err)
	}
	defer nc.Close()
	js, err := nc.JetStream()
	if err != nil {
		t.Fatal(err)
	}
	prefix := "example-worker-test-" + strings.ToLower(rand.Text()[:10]) + "-"
	t.Cleanup(func() {
		for name := range js.StreamNames() {
			if strings.HasPrefix(name, prefix) {
				_ = js.DeleteStream(name)
			}
		}
	})
	var stdout, stderr bytes.Buffer
	if code := realMain([]string{"--broker=nats", "--count=300", "--partitions=2", "--topic-prefix=" + prefix}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit code %d\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimRight(stdout.String(), "\n"), "\n")
	// 300 commands: 60 delivered twice, 30 sent again under a new UUID, 6
	// invalid (cached failures, no charge).
	if last := lines[len(lines)-1]; !summaryLine.MatchString(last) || !strings.HasPrefix(last, "summary: published=300 deliveries=390 unique=300 effects=294 ") {
		t.Errorf("last stdout line %q, want published=300 deliveries=390 unique=300 effects=294 and none doubled or lost", last)
	}
	streams := 0
	for name := range js.StreamNames() {
		if strings.HasPrefix(name, prefix) {
			streams++
		}
	}
	if streams != 4 { // payments-0, payments-1, settlements, dead-letters
		t.Errorf("%d streams of the run, want 4: one per topic", streams)
	}
}
