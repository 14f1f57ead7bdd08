package idempotency_test

import (
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"

	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/policy"
)

// progressHandler succeeds, fails permanently on "decline" and retryably on
// "busy".
func progressHandler(m *message.Message) ([]*message.Message, error) {
	switch string(m.Payload) {
	case "decline":
		return nil, policy.Cached(errDeclined)
	case "busy":
		return nil, errors.New("database busy")
	}
	return nil, nil
}

// The delivery span carries the TTL of the outcome the delivery recorded:
// the success TTL of a success, the failure TTL of a cached failure and of
// a released key (which keeps its attempt count that long); a replay
// records nothing, and carries none.
func TestTelemetryStoredTTL(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) {
		k.use(&c.Config)
		c.Policy.SuccessTTL, c.Policy.FailureTTL = 2*time.Hour, 30*time.Minute
	})
	handler := h.stage.Middleware(progressHandler)
	for _, m := range []*message.Message{msg("m1", "ok"), msg("m1", "ok"), msg("m2", "decline"), msg("m2", "decline"), msg("m3", "busy")} {
		_, _ = handler(m)
	}
	spans := k.deliveries()
	want := []float64{7200, 0, 1800, 0, 1800} // 0: absent
	if len(spans) != len(want) {
		t.Fatalf("%d delivery spans, want %d", len(spans), len(want))
	}
	for i, w := range want {
		got, ok := teltest.SpanAttrs(spans[i])["idempotency.ttl_seconds"]
		switch {
		case w == 0 && ok:
			t.Errorf("delivery %d: idempotency.ttl_seconds = %v, want it absent", i, got.Emit())
		case w != 0 && (!ok || got.Type() != attribute.FLOAT64 || got.AsFloat64() != w):
			t.Errorf("delivery %d: idempotency.ttl_seconds = %v (present %v), want %v", i, got.Emit(), ok, w)
		}
	}
}

// At debug level an execution logs "processing" before its handler runs and
// "stored" once its outcome is recorded, with the delivery's fields; a
// replay logs neither, but a line of its own with the original outcome.
func TestDebugLinesOfADeliverysProgress(t *testing.T) {
	t.Parallel()
	logs, logger := testenv.NewLogs()
	h := newHarness(t, func(c *stageConfig) {
		c.Logger = logger
		c.Policy.SuccessTTL, c.Policy.FailureTTL = 2*time.Hour, 30*time.Minute
	})
	var before []string // the last line when the handler ran
	handler := h.stage.Middleware(func(m *message.Message) ([]*message.Message, error) {
		all := logs.All()
		before = append(before, all[len(all)-1].Msg)
		return progressHandler(m)
	})
	for _, m := range []*message.Message{msg("m1", "ok"), msg("m1", "ok"), msg("m2", "decline"), msg("m2", "decline")} {
		_, _ = handler(m)
	}
	const (
		processing = "Processing: the handler runs under the claim"
		stored     = "Stored: the outcome is recorded for its duplicates"
		replayed   = "Duplicate replayed; the handler did not run"
	)
	for i, msg := range before {
		if msg != processing {
			t.Errorf("execution %d: the last line before the handler ran is %q, want %q", i, msg, processing)
		}
	}
	lines := logs.At(slog.LevelDebug)
	want := []struct {
		msg, key, outcome, ttl string // outcome and ttl: stored lines only
		attempt                int64  // 0 for a replay, whose original's is original_attempt
		original               string // replayed lines only
	}{
		{processing, "m1", "", "", 1, ""},
		{stored, "m1", "executed", "2h0m0s", 1, ""},
		{replayed, "m1", "", "", 0, "succeeded"},
		{processing, "m2", "", "", 1, ""},
		{stored, "m2", "cached_failure", "30m0s", 1, ""},
		{replayed, "m2", "", "", 0, "cached_failure"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d debug lines, want %d: %+v", len(lines), len(want), lines)
	}
	for i, w := range want {
		l := lines[i]
		if l.Msg != w.msg || l.Attrs["message_uuid"] != w.key || l.Attrs["key"] != w.key || l.Attrs["scope"] != "test" || l.Attrs["attempt"] != w.attempt {
			t.Errorf("line %d: %+v, want %q with the delivery's fields (key %s, attempt %d)", i, l, w.msg, w.key, w.attempt)
		}
		if w.original != "" && (l.Attrs["original"] != w.original || l.Attrs["original_attempt"] != int64(1)) {
			t.Errorf("line %d: original %v (attempt %v), want %s (attempt 1)", i, l.Attrs["original"], l.Attrs["original_attempt"], w.original)
		}
		if w.outcome != "" && (l.Attrs["outcome"] != w.outcome || l.Attrs["ttl"] != w.ttl) {
			t.Errorf("line %d: outcome %v ttl %v, want %s and %s", i, l.Attrs["outcome"], l.Attrs["ttl"], w.outcome, w.ttl)
		}
	}
}
