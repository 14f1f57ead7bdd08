package main

// The worker's oncemill receiver, its key generator and its logger. The
// broker is chosen in broker.go, the store in stores.go.

import (
	"context"
	"io"
	"log/slog"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
)

// newKeyGenerator says who a payment command is. By default (content) its
// content, without the envelope fields a re-send changes (meta.sent_at,
// meta.attempt): the same command re-sent under a new UUID is the same key.
// With uuid, the message UUID: a re-send is a new message.
func newKeyGenerator(kind string) (keygen.Generator, error) {
	if kind == "uuid" {
		return keygen.UUID(), nil
	}
	return keygen.ContentHash(keygen.ContentHashOptions{
		Exclude:       []string{"meta.sent_at", "meta.attempt"},
		RejectNonJSON: true,
	})
}

// guardDeps is what the oncemill receiver is built over.
type guardDeps struct {
	store     store.Store
	tx        store.Transactional // nil: the lease mode over store
	keys      keygen.Generator
	log       *slog.Logger
	onEvent   func(pipeline.Event)
	deadPub   message.Publisher // nil: no dead-letter topic
	deadTopic string
	tel       *telemetry // nil: the global OpenTelemetry providers
	system    string     // messaging.system
}

// newGuard returns the middleware every payments handler runs behind: the
// oncemill receiver, or with --no-idempotency the plain-consumer baseline.
// All partitions share one receiver and one scope, so a command delivered to
// two partitions is one key.
func newGuard(cfg config, d guardDeps) (message.HandlerMiddleware, error) {
	if cfg.NoIdempotency {
		return withoutIdempotency(watermill.NewSlogLogger(d.log), d.onEvent), nil
	}
	// The one-transaction mode (postgres): the ledger row and the
	// "processed" record commit in one PostgreSQL transaction. Otherwise
	// the lease mode.
	b := receiver.New(d.store)
	if d.tx != nil {
		b = receiver.NewTransactional(d.tx)
	}
	b = b.WithKeyGenerator(d.keys).
		WithScope(cfg.Scope).
		WithLease(cfg.Lease).
		WithHeartbeat(cfg.Lease/3).
		// A duplicate of a running command waits for it and then replays;
		// the wait outlasts a stall (1.5x lease) with room to spare.
		WithInProgress(policy.HeldKeyWait, 3*cfg.Lease).
		// gochannel and AMQP redeliver a nack at once; pause so a waiter
		// does not spin.
		WithNackDelay(cfg.Lease / 10).
		// An invalid amount never becomes valid: cache the failure. (The
		// handler also marks it policy.Permanent; either alone would do.)
		WithCachedErrors(errInvalidAmount).
		WithSlog(d.log).
		WithEventHandler(d.onEvent)
	if d.deadPub != nil {
		b = b.WithDeadLetter(d.deadPub, d.deadTopic)
	}
	if d.tel != nil {
		b = b.WithMeterProvider(d.tel.meters).WithMessagingSystem(d.system)
		if d.tel.tracer != nil {
			b = b.WithTracerProvider(d.tel.tracer)
		}
	}
	r, err := b.Build()
	if err != nil {
		return nil, err
	}
	return r.Middleware, nil
}

// newLogger returns the slog logger of the router, the broker and oncemill,
// writing to w at level in format (text or json). Every error is counted in
// errs, whatever the level: this workload logs errors on purpose (permanent
// failures, transient timeouts), so the default is to count them and print
// nothing.
func newLogger(level, format string, w io.Writer, errs *atomic.Int64) *slog.Logger {
	slogLevel := map[string]slog.Level{
		"error": slog.LevelError,
		"info":  slog.LevelInfo,
		"debug": slog.LevelDebug,
		"trace": watermill.LevelTrace,
	}
	var inner slog.Handler
	if l, ok := slogLevel[level]; ok {
		opts := &slog.HandlerOptions{Level: l}
		if format == "json" {
			inner = slog.NewJSONHandler(w, opts)
		} else {
			inner = slog.NewTextHandler(w, opts)
		}
	}
	return slog.New(countingHandler{inner: inner, errs: errs})
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
