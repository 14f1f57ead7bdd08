package worker

// The consume mode: the deployable worker. It consumes the payments topics
// until SIGTERM, logging its progress, then drains what is in flight and
// exits.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/oncemill/oncemill/pipeline"
)

// Consume runs the worker until ctx ends (SIGTERM), then drains.
func Consume(ctx context.Context, cfg Config, hooks Hooks, stdout, stderr io.Writer) error {
	var logErrors atomic.Int64
	log := NewLogger(cfg.LogLevel, cfg.LogFormat, stderr, &logErrors)
	log.Info("Starting the worker", "broker", cfg.Broker, "store", cfg.Store, "topic_prefix", cfg.TopicPrefix,
		"partitions", cfg.Partitions, "scope", cfg.Scope, "lease", cfg.Lease)

	ss, err := OpenStore(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer ss.Close()
	b, err := OpenBroker(ctx, cfg, hooks, log)
	if err != nil {
		return err
	}
	defer func() { _ = b.Close() }()
	tel, err := newTelemetry(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = tel.shutdown(context.WithoutCancel(ctx)) }()
	return serve(ctx, cfg, hooks, log, b, ss, tel, stdout)
}

// serve runs the router over b until ctx ends, then drains: the router
// stops taking messages and waits up to --drain-timeout for the handlers
// in flight. Watermill closes the subscribers first, so a delivery that
// finishes during the drain may lose its ack (Kafka drops it once the
// subscriber closes) and come back after the restart; oncemill replays it.
func serve(ctx context.Context, cfg Config, hooks Hooks, log *slog.Logger, b *Broker, ss *Stores, tel *Telemetry, stdout io.Writer) error {
	tp := Topics{Prefix: cfg.TopicPrefix}
	var outcomes Tally
	onEvent := func(ev pipeline.Event) {
		outcomes.Record(ev)
		if log.Enabled(context.Background(), slog.LevelDebug) {
			attrs := []any{"outcome", ev.Outcome.String(), "message_uuid", ev.MessageUUID, "key", ev.Key,
				"attempt", ev.Attempt, "token", ev.Token, "takeover", ev.Takeover}
			if ev.Err != nil {
				attrs = append(attrs, "error", ev.Err.Error())
			}
			log.Debug("delivery", attrs...)
		}
	}
	router, err := NewRouter(cfg, hooks, log, b, ss, RouterOptions{
		OnEvent:      onEvent,
		First:        func(int) []message.HandlerMiddleware { return []message.HandlerMiddleware{finishOnShutdown} },
		CloseTimeout: cfg.DrainTimeout,
		DeadLetters:  true,
		Telemetry:    tel,
	})
	if err != nil {
		return err
	}

	routerDone := make(chan error, 1)
	go func() { routerDone <- router.Run(context.WithoutCancel(ctx)) }()
	if cfg.HTTPAddr != "" {
		addr, stop, err := serveProbes(cfg.HTTPAddr, probes{
			registry: tel.registry,
			ready: func(ctx context.Context) error {
				if !router.IsRunning() {
					return fmt.Errorf("the router is not running")
				}
				return storeAnswers(ctx, ss.Admin)
			},
		}, log)
		if err != nil {
			_ = router.Close()
			<-routerDone
			return err
		}
		defer stop()
		fmt.Fprintf(stdout, "listening: http://%s\n", addr)
		log.Info("Serving /metrics, /healthz and /readyz", "addr", addr)
	}
	select {
	case <-router.Running():
	case err := <-routerDone:
		return fmt.Errorf("router stopped before running: %w", err)
	}
	fmt.Fprintln(stdout, "consuming:", tp.Payments(0), "to", tp.Payments(cfg.Partitions-1))
	log.Info("Consuming")

	var tick <-chan time.Time
	if cfg.Progress > 0 {
		ticker := time.NewTicker(cfg.Progress)
		defer ticker.Stop()
		tick = ticker.C
	}
	for running := true; running; {
		select {
		case <-tick:
			log.Info("Progress", outcomes.LogAttrs()...)
		case <-ctx.Done():
			running = false
		case err := <-routerDone:
			return fmt.Errorf("router stopped: %w", err)
		}
	}
	log.Info("Draining the messages in flight", "timeout", cfg.DrainTimeout)
	closeErr := router.Close()
	<-routerDone
	fmt.Fprintf(stdout, "consumed: deliveries=%d %s\n", outcomes.Deliveries(), outcomes.Outcomes())
	if closeErr != nil {
		return fmt.Errorf("drain: %w", closeErr)
	}
	log.Info("Drained; exiting", outcomes.LogAttrs()...)
	return nil
}

// finishOnShutdown lets a delivery in flight finish during the drain.
// Closing a subscriber cancels the context of the messages it handed out
// (gochannel, watermill-kafka), which would abandon the handler halfway and
// nack; the handler gets the message's context without its cancellation
// instead (values such as the Kafka partition and offset stay), and
// --drain-timeout bounds how long the router waits for it. oncemill still
// cancels the handler if its lease is lost.
func finishOnShutdown(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		msg.SetContext(context.WithoutCancel(msg.Context()))
		return h(msg)
	}
}
