package main

// The produce mode: publish the workload, duplicates included, for workers
// in other processes, and exit.

import (
	"context"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

func produce(ctx context.Context, cfg config, stdout, stderr io.Writer) error {
	var logErrors atomic.Int64
	log := newLogger(cfg.LogLevel, cfg.LogFormat, stderr, &logErrors)
	b, err := newBroker(cfg, watermill.NewSlogLogger(log))
	if err != nil {
		return err
	}
	defer func() { _ = b.close() }()
	tp := topics{prefix: cfg.TopicPrefix}
	if err := b.initTopics(ctx, tp.all(cfg.Partitions)); err != nil {
		return err
	}
	keys, err := newKeyGenerator(cfg.Key)
	if err != nil {
		return fmt.Errorf("key generator: %w", err)
	}

	p := newPlan(cfg)
	// The consumers have no plan: each command carries its gateway fault.
	p.markFaults()
	prod := newProducer(p, b.pub, tp, keys, newTracker(cfg.Partitions), 0)
	prod.pairWait = 0 // no acks are seen here: publish concurrent copies back to back

	ctx, cancel := context.WithTimeoutCause(ctx, cfg.Timeout, fmt.Errorf("timed out after %v", cfg.Timeout))
	defer cancel()
	start := time.Now()
	if err := prod.run(ctx); err != nil {
		return err
	}
	elapsed := time.Since(start)
	fmt.Fprintf(stdout, "produced: commands=%d deliveries=%d unique=%d invalid=%d expected_effects=%d topics=%s..%s elapsed=%v msgs_per_sec=%.0f\n",
		prod.commands, p.deliveries, len(prod.keysSeen), p.counts.invalid, len(p.commands)-p.counts.invalid,
		tp.payments(0), tp.payments(cfg.Partitions-1), elapsed.Round(time.Millisecond), float64(p.deliveries)/elapsed.Seconds())
	return nil
}
