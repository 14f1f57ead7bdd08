package receiver_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store/memory"
)

// logCapture is a slog.Handler that keeps every record, at every level.
type logCapture struct {
	mu      sync.Mutex
	records []logLine
}

// logLine is one captured record: its level, message and attributes.
type logLine struct {
	Level slog.Level
	Msg   string
	Attrs map[string]any
}

func (c *logCapture) Enabled(context.Context, slog.Level) bool { return true }

func (c *logCapture) Handle(_ context.Context, r slog.Record) error {
	l := logLine{Level: r.Level, Msg: r.Message, Attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		l.Attrs[a.Key] = a.Value.Any()
		return true
	})
	c.mu.Lock()
	c.records = append(c.records, l)
	c.mu.Unlock()
	return nil
}

func (c *logCapture) WithAttrs([]slog.Attr) slog.Handler { return c }
func (c *logCapture) WithGroup(string) slog.Handler      { return c }

// at returns the lines logged at level.
func (c *logCapture) at(level slog.Level) []logLine {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []logLine
	for _, l := range c.records {
		if l.Level == level {
			out = append(out, l)
		}
	}
	return out
}

// captureDefault makes slog.Default() write to a capture until the test
// ends. A test that calls it must not run in parallel: the default logger
// is the process's.
func captureDefault(t *testing.T) *logCapture {
	t.Helper()
	prev := slog.Default()
	t.Cleanup(func() { slog.SetDefault(prev) })
	c := &logCapture{}
	slog.SetDefault(slog.New(c))
	return c
}

// Nothing dropped in silence: with the builder's defaults and no logger, a
// message whose key cannot be computed is rejected with one error line on
// slog.Default() that names the key generator's error.
func TestNoLoggerStillLogsARejectionThroughSlogDefault(t *testing.T) {
	logs := captureDefault(t) // not parallel: it replaces slog.Default()
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	keys, err := keygen.Metadata("Idempotency-Key")
	if err != nil {
		t.Fatal(err)
	}
	r, err := receiver.New(st).WithKeyGenerator(keys).Build()
	if err != nil {
		t.Fatal(err)
	}
	ran := false
	h := r.Middleware(func(*message.Message) ([]*message.Message, error) { ran = true; return nil, nil })
	if _, err := h(message.NewMessage("order-1", []byte(`{"amount":"12.00"}`))); err != nil {
		t.Fatalf("a message without a key must be acked, got %v", err)
	}
	if ran {
		t.Fatal("the handler ran for a message without a key")
	}
	errs := logs.at(slog.LevelError)
	if len(errs) != 1 {
		t.Fatalf("error lines %+v, want exactly 1", errs)
	}
	l := errs[0]
	lerr, _ := l.Attrs["error"].(error)
	const want = `metadata field "Idempotency-Key" is missing or empty`
	if lerr == nil || !strings.Contains(lerr.Error(), want) || !errors.Is(lerr, keygen.ErrNoKey) {
		t.Fatalf("error line %+v: its error %v does not name the key generator's error %q", l, lerr, want)
	}
	if l.Msg != "Message rejected as a permanent failure; it is acked and not run" || l.Attrs["message_uuid"] != "order-1" {
		t.Fatalf("error line %+v, want the rejection of order-1", l)
	}
}
