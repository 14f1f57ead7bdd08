package worker

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// Durations are written as "30s", in JSON too (where slog writes
// nanoseconds), whether logged as a duration, inside Any, in a group, or
// through Watermill's logger adapter.
func TestLogWritesDurationsAsStrings(t *testing.T) {
	var buf bytes.Buffer
	var errs atomic.Int64
	log := NewLogger("info", "json", &buf, &errs)
	log.Info("one", "timeout", 30*time.Second, slog.Any("any", 1500*time.Millisecond),
		slog.Group("g", "lease", 2*time.Second), "count", 3)
	watermill.NewSlogLogger(log).Info("two", watermill.LogFields{"wait": 250 * time.Millisecond})

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("want 2 log lines, got %q", buf.String())
	}
	var one, two map[string]any
	if err := json.Unmarshal([]byte(lines[0]), &one); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(lines[1]), &two); err != nil {
		t.Fatal(err)
	}
	if one["timeout"] != "30s" || one["any"] != "1.5s" || one["g"].(map[string]any)["lease"] != "2s" || one["count"] != 3.0 {
		t.Errorf("record %s: want timeout \"30s\", any \"1.5s\", g.lease \"2s\" and count 3", lines[0])
	}
	if two["wait"] != "250ms" {
		t.Errorf("record %s: want wait \"250ms\"", lines[1])
	}
}

// go-redis's own lines go through the structured logger, as warnings.
func TestRedisLoggerWritesStructuredWarnings(t *testing.T) {
	var buf bytes.Buffer
	var errs atomic.Int64
	log := NewLogger("info", "json", &buf, &errs)
	RedisLogger{Log: log}.Printf(context.Background(), "redis: %s:%d: connection pool: %s\n", "pool.go", 770, "bad connection")

	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("%q is not one JSON record: %v", buf.String(), err)
	}
	if rec["level"] != "WARN" || rec["msg"] != "redis: pool.go:770: connection pool: bad connection" || rec["component"] != "go-redis" {
		t.Errorf("record %v: want level WARN, the formatted line as msg and component go-redis", rec)
	}
	if errs.Load() != 0 {
		t.Errorf("a warning counted as %d errors", errs.Load())
	}
}
