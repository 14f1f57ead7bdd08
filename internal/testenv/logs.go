package testenv

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
)

// Logs is a slog.Handler that keeps every record, at every level, for the
// tests that assert what was logged.
type Logs struct {
	mu    sync.Mutex
	lines []LogLine
}

// LogLine is one kept record: its level, message and attributes.
type LogLine struct {
	Level slog.Level
	Msg   string
	Attrs map[string]any
}

// Err is the line's "error" attribute, nil without one.
func (l LogLine) Err() error {
	err, _ := l.Attrs["error"].(error)
	return err
}

// NewLogs returns a Logs and a logger that writes to it.
func NewLogs() (*Logs, *slog.Logger) {
	l := &Logs{}
	return l, slog.New(l)
}

// CaptureDefault makes slog.Default() write to a Logs until the test ends.
// A test that calls it must not run in parallel: the default logger is the
// process's.
func CaptureDefault(tb testing.TB) *Logs {
	tb.Helper()
	prev := slog.Default()
	tb.Cleanup(func() { slog.SetDefault(prev) })
	l, logger := NewLogs()
	slog.SetDefault(logger)
	return l
}

func (l *Logs) Enabled(context.Context, slog.Level) bool { return true }

func (l *Logs) Handle(_ context.Context, r slog.Record) error {
	line := LogLine{Level: r.Level, Msg: r.Message, Attrs: map[string]any{}}
	r.Attrs(func(a slog.Attr) bool {
		line.Attrs[a.Key] = a.Value.Any()
		return true
	})
	l.mu.Lock()
	l.lines = append(l.lines, line)
	l.mu.Unlock()
	return nil
}

func (l *Logs) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *Logs) WithGroup(string) slog.Handler      { return l }

// All returns every line, in order.
func (l *Logs) All() []LogLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.lines)
}

// At returns the lines logged at level, in order.
func (l *Logs) At(level slog.Level) []LogLine {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []LogLine
	for _, line := range l.lines {
		if line.Level == level {
			out = append(out, line)
		}
	}
	return out
}
