package worker

// The wiring: who a command is (the key), oncemill's receiver around the
// handler, and the router handlers of the payments topics. The broker is
// opened in brokers.go, the store in stores.go.

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/keygen/kafkakeys"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
)

// NewKeyGenerator says who a payment command is. By default (content) its
// content, without the envelope fields a re-send changes (meta.sent_at,
// meta.attempt): the same command re-sent under a new UUID is the same key.
// With uuid, the message UUID: a re-send is a new message.
func NewKeyGenerator(kind string) (keygen.Generator, error) {
	if kind == "uuid" {
		return keygen.UUID(), nil
	}
	return keygen.ContentHash(keygen.ContentHashOptions{
		Exclude:       []string{"meta.sent_at", "meta.attempt"},
		RejectNonJSON: true,
	})
}

// ReceiverDeps is what the oncemill receiver is built over.
type ReceiverDeps struct {
	Store     store.Store
	Tx        store.Transactional // nil: the lease mode over Store
	Keys      keygen.Generator
	Log       *slog.Logger
	OnEvent   func(pipeline.Event)
	DeadPub   message.Publisher // nil: no dead-letter topic
	DeadTopic string
	Tel       *Telemetry         // nil: the global OpenTelemetry providers
	System    attribute.KeyValue // messaging.system of the broker
	// Group and HighWaterMark are the watermark mode's (--kafka-watermark):
	// the consumer group of the handler the receiver serves, and the
	// broker's high-water marks.
	Group         string
	HighWaterMark func(ctx context.Context, topic string, partition int32) (int64, error)
}

// NewReceiver returns the middleware every payments handler runs behind:
// oncemill's receiver. All partitions share one receiver and one scope, so
// a command delivered to two partitions is one key.
func NewReceiver(cfg Config, d ReceiverDeps) (message.HandlerMiddleware, error) {
	// With PostgreSQL, the one-transaction mode: the ledger row and the
	// "processed" record commit in one transaction. Otherwise the lease mode.
	p := policy.Policy{
		LeaseDuration: cfg.Lease, // the heartbeat renews it every Lease/3
		// A duplicate of a running command waits for it (HeldKeyWait,
		// the default) and then replays; the wait outlasts a handler
		// that takes longer than the lease.
		HeldKeyTimeout: 3 * cfg.Lease,
		// gochannel and AMQP redeliver a nack at once; pause so a waiter
		// does not spin.
		NackDelay: cfg.Lease / 10,
		// An invalid amount never becomes valid: cache the failure. (The
		// handler also marks it policy.Cached; either alone would do.)
		CachedErrors: []error{ErrInvalidAmount},
	}
	b := receiver.New(d.Store)
	if d.Tx != nil {
		b = receiver.NewTransactional(d.Tx)
		p.LeaseDuration = 0 // the claim is held by the handler's transaction
	}
	if cfg.KafkaWatermark {
		// The key is the message's offset, its rows are (group, topic,
		// partition): no key generator, no scope.
		b = b.WithKafkaWatermark(pipeline.KafkaWatermark{Group: d.Group, Position: kafkakeys.Position, HighWaterMark: d.HighWaterMark})
	} else {
		b = b.WithKeyGenerator(d.Keys).WithScope(cfg.Scope)
	}
	b = b.WithPolicy(p).
		WithLogger(d.Log).
		WithEventHandler(d.OnEvent)
	if d.DeadPub != nil {
		b = b.WithDeadLetter(d.DeadPub, d.DeadTopic)
	}
	if d.Tel != nil {
		b = b.WithMeterProvider(d.Tel.meters).WithMessagingSystem(d.System)
		if d.Tel.tracer != nil {
			b = b.WithTracerProvider(d.Tel.tracer)
		}
	}
	r, err := b.Build()
	if err != nil {
		return nil, err
	}
	return r.Middleware, nil
}

// RouterOptions say how NewRouter assembles the router.
type RouterOptions struct {
	// OnEvent is told what oncemill decided for each delivery.
	OnEvent func(pipeline.Event)
	// First wrap partition i's handler outermost, before the hooks' Outer.
	First func(partition int) []message.HandlerMiddleware
	// CloseTimeout bounds how long Close waits for the handlers in flight.
	CloseTimeout time.Duration
	// DeadLetters forwards what will never be processed to the dead-letter topic.
	DeadLetters bool
	// Telemetry receives metrics and traces (nil: the global providers).
	Telemetry *Telemetry
}

// NewRouter returns the router: one handler per payments topic, each
// running the payment handler behind, from the outside in, opts.First, the
// hooks' Outer, oncemill's receiver and the hooks' Inner. The handlers'
// settlements go to the settlements topic.
func NewRouter(cfg Config, hooks Hooks, log *slog.Logger, b *Broker, ss *Stores, opts RouterOptions) (*message.Router, error) {
	keys, err := NewKeyGenerator(cfg.Key)
	if err != nil {
		return nil, fmt.Errorf("key generator: %w", err)
	}
	tp := Topics{Prefix: cfg.TopicPrefix}
	d := ReceiverDeps{Store: ss.Store, Tx: ss.Tx, Keys: keys, Log: log, OnEvent: opts.OnEvent, Tel: opts.Telemetry, System: b.System}
	if opts.DeadLetters {
		d.DeadPub, d.DeadTopic = b.Pub, tp.DeadLetters()
	}
	d.HighWaterMark = b.HighWaterMark
	var rmw message.HandlerMiddleware
	if !cfg.KafkaWatermark { // else one per handler, below
		if rmw, err = hooks.newReceiver(cfg, d); err != nil {
			return nil, err
		}
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: opts.CloseTimeout}, watermill.NewSlogLogger(log))
	if err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	h := &PaymentHandler{Ledger: ss.Ledger, Scope: cfg.Scope}
	for i := range cfg.Partitions {
		topic := tp.Payments(i)
		sub, err := b.Subscriber(cfg.ConsumerGroup + "-" + topic)
		if err != nil {
			return nil, fmt.Errorf("subscriber of %s: %w", topic, err)
		}
		rh := router.AddHandler("payments-"+strconv.Itoa(i), topic, sub, tp.Settlements(), b.HandlerPublisher(), h.Handle)
		// The first middleware added is the outermost.
		var mws []message.HandlerMiddleware
		if opts.First != nil {
			mws = append(mws, opts.First(i)...)
		}
		hmw := rmw
		if cfg.KafkaWatermark {
			// The watermark mode's rows belong to a consumer group, and
			// each topic has its own: a receiver per handler.
			d.Group = cfg.ConsumerGroup + "-" + topic
			if hmw, err = hooks.newReceiver(cfg, d); err != nil {
				return nil, err
			}
		}
		mws = append(append(append(mws, hooks.Outer...), hmw), hooks.Inner...)
		rh.AddMiddleware(mws...)
	}
	return router, nil
}

// StartRouter runs router until it is closed (not when ctx ends: it stops
// in order through Close) and waits until it is running. done receives what
// Run returned.
func StartRouter(ctx context.Context, router *message.Router) (done <-chan error, err error) {
	runDone := make(chan error, 1)
	go func() { runDone <- router.Run(context.WithoutCancel(ctx)) }()
	select {
	case <-router.Running():
		return runDone, nil
	case err := <-runDone:
		return nil, fmt.Errorf("router stopped before running: %w", err)
	case <-ctx.Done():
		_ = router.Close()
		<-runDone
		return nil, context.Cause(ctx)
	}
}

// OpenBroker connects to the broker (through hooks.Broker if set) and
// creates the worker's topics.
func OpenBroker(ctx context.Context, cfg Config, hooks Hooks, log *slog.Logger) (*Broker, error) {
	logger := watermill.NewSlogLogger(log)
	var b *Broker
	var err error
	if hooks.Broker != nil {
		b, err = hooks.Broker(cfg, logger)
	} else {
		b, err = NewBroker(cfg, logger)
	}
	if err != nil {
		return nil, err
	}
	if err := b.InitTopics(ctx, Topics{Prefix: cfg.TopicPrefix}.All(cfg.Partitions)); err != nil {
		_ = b.Close()
		return nil, err
	}
	return b, nil
}

// Hooks change the worker for a test tool (integration/cmd/oncemill-soak);
// the worker rig sets none.
type Hooks struct {
	// Broker opens the broker in place of NewBroker.
	Broker func(cfg Config, logger watermill.LoggerAdapter) (*Broker, error)
	// NewReceiver builds the middleware in place of the package's
	// NewReceiver.
	NewReceiver func(cfg Config, d ReceiverDeps) (message.HandlerMiddleware, error)
	// Outer wrap each payments handler outside the receiver, so they see
	// what the router does; Inner wrap the payment handler inside it.
	Outer, Inner []message.HandlerMiddleware
	// Copies names the other partitions the first send of command i goes to
	// at the same moment as to home (concurrent duplicates); it may wait
	// until they are idle.
	Copies func(ctx context.Context, i, home int) []int
}

func (h Hooks) newReceiver(cfg Config, d ReceiverDeps) (message.HandlerMiddleware, error) {
	if h.NewReceiver != nil {
		return h.NewReceiver(cfg, d)
	}
	return NewReceiver(cfg, d)
}
