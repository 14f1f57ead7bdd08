package main

// The worker's replaceable parts: the broker, the store, the logger and the
// oncemill receiver. Each is chosen by a flag here, so a real broker or store
// is one more case in a switch (and one more name in main.go's lists).

import (
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// Topics. Commands for partition i go to paymentsTopic(i).
const settlementsTopic = "settlements"

func paymentsTopic(partition int) string { return fmt.Sprintf("payments.%d", partition) }

// broker is where commands are published and consumed.
type broker struct {
	pub   message.Publisher
	sub   message.Subscriber
	close func() error
}

func newBroker(cfg config, logger watermill.LoggerAdapter) (broker, error) {
	switch cfg.Broker {
	case "gochannel":
		return newGoChannel(logger), nil
	}
	return broker{}, fmt.Errorf("--broker=%q is not built in", cfg.Broker)
}

// newGoChannel is the in-process broker. It delivers to each subscriber one
// message at a time and redelivers a nacked message at once; concurrency
// comes from the partitions. Publishing does not wait for the ack, and the
// producer limits what is in flight itself.
func newGoChannel(logger watermill.LoggerAdapter) broker {
	ps := gochannel.NewGoChannel(gochannel.Config{}, logger)
	return broker{pub: ps, sub: ps, close: ps.Close}
}

// newStore returns the idempotency store and how to close it.
func newStore(cfg config) (store.Store, func() error, error) {
	switch cfg.Store {
	case "memory":
		st, err := memory.New(memory.Options{})
		if err != nil {
			return nil, nil, fmt.Errorf("memory store: %w", err)
		}
		return st, st.Close, nil
	}
	return nil, nil, fmt.Errorf("--store=%q is not built in", cfg.Store)
}

// newKeyGenerator says who a payment command is: its content, without the
// envelope fields a re-send changes (meta.sent_at, meta.attempt). The same
// command re-sent under a new UUID is therefore the same key.
func newKeyGenerator() (keygen.Generator, error) {
	return keygen.ContentHash(keygen.ContentHashOptions{
		Exclude:       []string{"meta.sent_at", "meta.attempt"},
		RejectNonJSON: true,
	})
}

// newGuard returns the middleware every payments handler runs behind: the
// oncemill receiver, or with --no-idempotency the plain-consumer baseline.
// All partitions share one receiver and one scope, so a command delivered to
// two partitions is one key.
func newGuard(cfg config, st store.Store, keys keygen.Generator, logger watermill.LoggerAdapter, onEvent func(pipeline.Event)) (message.HandlerMiddleware, error) {
	if cfg.NoIdempotency {
		return withoutIdempotency(logger, onEvent), nil
	}
	r, err := receiver.New(st).
		WithKeyGenerator(keys).
		WithScope("payments").
		WithLease(cfg.Lease).
		WithHeartbeat(cfg.Lease/3).
		// A duplicate of a running command waits for it and then replays;
		// the wait outlasts a stall (1.5x lease) with room to spare.
		WithInProgress(policy.Wait, 3*cfg.Lease).
		// gochannel redelivers a nack at once; pause so a waiter does not spin.
		WithNackDelay(cfg.Lease / 10).
		// An invalid amount never becomes valid: cache the failure. (The
		// handler also marks it policy.Permanent; either alone would do.)
		WithCachedErrors(errInvalidAmount).
		WithLogger(logger).
		WithEventHandler(onEvent).
		Build()
	if err != nil {
		return nil, err
	}
	return r.Middleware, nil
}

// newLogger returns the Watermill logger for the router, the broker and
// oncemill, writing to w at level. Every error is counted in errs, whatever
// the level: this workload logs errors on purpose (permanent failures,
// transient timeouts), so the default is to count them and print nothing.
func newLogger(level string, w io.Writer, errs *atomic.Int64) watermill.LoggerAdapter {
	var inner watermill.LoggerAdapter = watermill.NopLogger{}
	slogLevel := map[string]slog.Level{
		"error": slog.LevelError,
		"info":  slog.LevelInfo,
		"debug": slog.LevelDebug,
		"trace": watermill.LevelTrace,
	}
	if l, ok := slogLevel[level]; ok {
		inner = watermill.NewSlogLogger(slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: l})))
	}
	return countingLogger{LoggerAdapter: inner, errs: errs}
}

// countingLogger counts the errors it logs.
type countingLogger struct {
	watermill.LoggerAdapter
	errs *atomic.Int64
}

func (l countingLogger) Error(msg string, err error, fields watermill.LogFields) {
	l.errs.Add(1)
	l.LoggerAdapter.Error(msg, err, fields)
}

func (l countingLogger) With(fields watermill.LogFields) watermill.LoggerAdapter {
	return countingLogger{LoggerAdapter: l.LoggerAdapter.With(fields), errs: l.errs}
}
