package worker

// The worker's logger: log/slog for the router, the brokers, oncemill and
// the store clients, with durations written as "30s" rather than
// nanoseconds.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/redis/go-redis/v9"
)

// NewLogger returns the slog logger of the router, the broker and oncemill,
// writing to w at level in format (text or json). Every error is counted in
// errs, whatever the level: a workload with invalid commands logs errors on
// purpose, so the run mode's default is to count them and print nothing.
func NewLogger(level, format string, w io.Writer, errs *atomic.Int64) *slog.Logger {
	slogLevel := map[string]slog.Level{
		"error": slog.LevelError,
		"info":  slog.LevelInfo,
		"debug": slog.LevelDebug,
		"trace": watermill.LevelTrace,
	}
	var inner slog.Handler
	if l, ok := slogLevel[level]; ok {
		opts := &slog.HandlerOptions{Level: l, ReplaceAttr: DurationsAsStrings}
		if format == "json" {
			inner = slog.NewJSONHandler(w, opts)
		} else {
			inner = slog.NewTextHandler(w, opts)
		}
	}
	return slog.New(countingHandler{inner: inner, errs: errs})
}

// DurationsAsStrings is a slog.HandlerOptions.ReplaceAttr that writes a
// time.Duration as its String ("30s"): the JSON handler would write
// nanoseconds (30000000000). slog.Any and Watermill's LogFields turn a
// time.Duration into a KindDuration value too.
func DurationsAsStrings(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// countingHandler counts the error records logged through it and passes
// records on to inner (nil: drops them).
type countingHandler struct {
	inner slog.Handler
	errs  *atomic.Int64
}

func (h countingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slog.LevelError || (h.inner != nil && h.inner.Enabled(ctx, l))
}

func (h countingHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level >= slog.LevelError {
		h.errs.Add(1)
	}
	if h.inner == nil || !h.inner.Enabled(ctx, r.Level) {
		return nil
	}
	return h.inner.Handle(ctx, r)
}

func (h countingHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if h.inner == nil {
		return h
	}
	return countingHandler{inner: h.inner.WithAttrs(attrs), errs: h.errs}
}

func (h countingHandler) WithGroup(name string) slog.Handler {
	if h.inner == nil {
		return h
	}
	return countingHandler{inner: h.inner.WithGroup(name), errs: h.errs}
}

// RedisLogger adapts a slog logger to go-redis's internal logger
// (redis.SetLogger), which otherwise prints plain-text lines such as
// "pool.go:770: ..." to stderr, into the middle of a JSON log. go-redis
// logs only what went wrong (a connection it dropped, a retry), so every
// line is a warning.
type RedisLogger struct{ Log *slog.Logger }

// Printf logs one go-redis line.
func (l RedisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.Log.WarnContext(ctx, strings.TrimSpace(fmt.Sprintf(format, v...)), "component", "go-redis")
}

// useRedisLogger sends go-redis's own log lines (a process-wide setting)
// through log.
func useRedisLogger(log *slog.Logger) { redis.SetLogger(RedisLogger{Log: log}) }
