package receiver_test

import (
	"bytes"
	"errors"
	"log/slog"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

// Each replay is logged at debug level with its original outcome and
// age, and oncemill.replay.age tells replays of successes from replays of
// cached failures.
func TestReplaysAreLoggedAndMeasured(t *testing.T) {
	t.Parallel()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	sdk := teltest.New(t)
	logs := &testenv.Logs{}
	declined := errors.New("card declined")
	r, err := receiver.New(st).
		WithScope("payments").
		WithPolicy(policy.Policy{CachedErrors: []error{declined}}).
		WithLogger(slog.New(logs)).
		WithMeterProvider(sdk.MeterProvider).
		Build()
	if err != nil {
		t.Fatal(err)
	}
	h := r.Middleware(func(m *message.Message) ([]*message.Message, error) {
		if m.UUID == "pay-declined" {
			return nil, declined
		}
		return nil, nil
	})
	for _, uuid := range []string{"pay-ok", "pay-ok", "pay-declined", "pay-declined", "pay-declined"} {
		_, _ = h(message.NewMessage(uuid, []byte("{}")))
	}

	debugs := logs.At(slog.LevelDebug)
	byOriginal := map[string]int{}
	for _, m := range debugs {
		if m.Msg != "Duplicate replayed; the handler did not run" {
			continue
		}
		if m.Attrs["scope"] != "payments" || m.Attrs["age"] == "" || m.Attrs["original_attempt"] != int64(1) {
			t.Errorf("replay logged with fields %v", m.Attrs)
		}
		byOriginal[m.Attrs["original"].(string)+"/"+m.Attrs["key"].(string)]++
	}
	if byOriginal["succeeded/pay-ok"] != 1 || byOriginal["cached_failure/pay-declined"] != 2 || len(byOriginal) != 2 {
		t.Fatalf("replays logged by original outcome and key: %v, want 1 succeeded/pay-ok and 2 cached_failure/pay-declined", byOriginal)
	}

	counts := teltest.HistCounts(t, sdk.Metrics(t), "oncemill.replay.age", "original")
	if counts["succeeded"] != 1 || counts["cached_failure"] != 2 {
		t.Fatalf("oncemill.replay.age counts by original: %v, want succeeded 1 and cached_failure 2", counts)
	}
}

// Above debug level, a replay writes no line, and neither does an
// execution.
func TestReplaysAreNotLoggedAboveDebug(t *testing.T) {
	t.Parallel()
	st, _ := memory.New(memory.Options{})
	defer st.Close()
	var lines bytes.Buffer
	r, err := receiver.New(st).WithLogger(slog.New(slog.NewTextHandler(&lines, &slog.HandlerOptions{Level: slog.LevelInfo}))).Build()
	if err != nil {
		t.Fatal(err)
	}
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) { return nil, nil })
	for range 2 {
		if _, err := h(message.NewMessage("pay-1", []byte("{}"))); err != nil {
			t.Fatal(err)
		}
	}
	if lines.Len() != 0 {
		t.Fatalf("lines at info level:\n%s\nwant none from the execution or the replay", lines.String())
	}
}
