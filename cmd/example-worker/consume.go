package main

// The consume mode: the deployable worker. It consumes the payments topics
// until SIGTERM, then drains what is in flight and exits.

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/pipeline"
)

func consume(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	var logErrors atomic.Int64
	log := newLogger(cfg.LogLevel, cfg.LogFormat, stderr, &logErrors)
	log.Info("Starting the worker", "broker", cfg.Broker, "store", cfg.Store, "topic_prefix", cfg.TopicPrefix,
		"partitions", cfg.Partitions, "scope", cfg.Scope, "idempotency", !cfg.NoIdempotency)

	ss, err := newStore(ctx, cfg)
	if err != nil {
		return err
	}
	defer ss.close()
	b, err := newBroker(cfg, watermill.NewSlogLogger(log))
	if err != nil {
		return err
	}
	defer func() { _ = b.close() }()
	tp := topics{prefix: cfg.TopicPrefix}
	if err := b.initTopics(ctx, tp.all(cfg.Partitions)); err != nil {
		return err
	}
	tel, err := newTelemetry(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = tel.shutdown(context.WithoutCancel(ctx)) }()
	return serve(ctx, cfg, log, b, ss, tel, stdout)
}

// serve runs the router over b until ctx ends, then drains: the router
// stops taking messages and waits up to --drain-timeout for the handlers
// in flight. Watermill closes the subscribers first, so a delivery that
// finishes during the drain may lose its ack (Kafka drops it once the
// subscriber closes) and come back after the restart; oncemill replays it.
func serve(ctx context.Context, cfg config, log *slog.Logger, b *broker, ss *storeSetup, tel *telemetry, stdout io.Writer) error {
	tp := topics{prefix: cfg.TopicPrefix}
	keys, err := newKeyGenerator(cfg.Key)
	if err != nil {
		return fmt.Errorf("key generator: %w", err)
	}
	var outcomes tally
	onEvent := func(ev pipeline.Event) {
		outcomes.record(ev)
		if log.Enabled(context.Background(), slog.LevelDebug) {
			attrs := []any{"outcome", ev.Outcome.String(), "message_uuid", ev.MessageUUID, "key", ev.Key,
				"attempt", ev.Attempt, "token", ev.Token, "takeover", ev.Takeover}
			if ev.Err != nil {
				attrs = append(attrs, "error", ev.Err.Error())
			}
			log.Debug("delivery", attrs...)
		}
	}
	guard, err := newGuard(cfg, guardDeps{
		store: ss.store, tx: ss.tx, keys: keys, log: log, onEvent: onEvent,
		deadPub: b.pub, deadTopic: tp.deadLetters(), tel: tel, system: b.system,
	})
	if err != nil {
		return err
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: cfg.DrainTimeout}, watermill.NewSlogLogger(log))
	if err != nil {
		return fmt.Errorf("router: %w", err)
	}
	h := &paymentHandler{gateway: newGateway(nil, cfg.Lease*3/2, cfg.Overlap, cfg.GatewayLatency), ledger: ss.ledger, scope: cfg.Scope}
	for i := range cfg.Partitions {
		topic := tp.payments(i)
		sub, err := b.subscriber(cfg.ConsumerGroup + "-" + topic)
		if err != nil {
			return fmt.Errorf("subscriber of %s: %w", topic, err)
		}
		rh := router.AddHandler("payments-"+strconv.Itoa(i), topic, sub, tp.settlements(), b.handlerPublisher(), h.handle)
		rh.AddMiddleware(finishOnShutdown, holdBeforeAck(cfg.HoldBeforeAck, stdout), guard)
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
				return storeAnswers(ctx, ss.store)
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
	fmt.Fprintln(stdout, "consuming:", tp.payments(0), "to", tp.payments(cfg.Partitions-1))
	log.Info("Consuming")

	select {
	case <-ctx.Done():
	case err := <-routerDone:
		return fmt.Errorf("router stopped: %w", err)
	}
	log.Info("Draining the messages in flight", "timeout", cfg.DrainTimeout)
	closeErr := router.Close()
	<-routerDone
	fmt.Fprintf(stdout, "consumed: executed=%d replayed=%d failure_cached=%d failure_replayed=%d released=%d in_progress_nacked=%d rejected=%d store_failed=%d\n",
		outcomes.count(pipeline.OutcomeExecuted), outcomes.count(pipeline.OutcomeReplayed), outcomes.count(pipeline.OutcomeFailureCached),
		outcomes.count(pipeline.OutcomeFailureReplayed), outcomes.count(pipeline.OutcomeReleased), outcomes.count(pipeline.OutcomeHeldKeyNacked),
		outcomes.count(pipeline.OutcomeRejected), outcomes.count(pipeline.OutcomeStoreFailed))
	if closeErr != nil {
		return fmt.Errorf("drain: %w", closeErr)
	}
	log.Info("Drained; exiting")
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
