package postgres

import (
	"context"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names. Every instrument carries the attribute
// oncemill.store.table = "<schema>.<table>".
const (
	// MetricCleanupLag is an observable gauge, in seconds: the age of the
	// oldest expired row still in the table (now() − min(expires_at) of
	// expired rows, by the database clock), 0 when none is left. Below the
	// cleanup interval is healthy; a steady rise means cleanup is not
	// keeping up or not running.
	MetricCleanupLag = "oncemill.store.cleanup.lag"
	// MetricCleanupDeleted counts rows removed by cleanup.
	MetricCleanupDeleted = "oncemill.store.cleanup.deleted"
	// MetricBatchSize is a histogram of requests per coalesced statement,
	// with the attribute oncemill.store.operation = begin or complete.
	MetricBatchSize = "oncemill.store.batch.size"
)

const meterName = "github.com/oncemill/oncemill/store/postgres"

type operation string

const (
	opBegin    operation = "begin"
	opComplete operation = "complete"
)

type telemetry struct {
	table      attribute.KeyValue
	batchSize  metric.Int64Histogram
	deleted    metric.Int64Counter
	reg        metric.Registration
	beginAttrs metric.MeasurementOption
	compAttrs  metric.MeasurementOption
	tableAttrs metric.MeasurementOption
}

func newTelemetry(s *Store) (*telemetry, error) {
	mp := s.opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(meterName)
	t := &telemetry{table: attribute.String("oncemill.store.table", s.opts.Schema+"."+s.opts.Table)}
	t.tableAttrs = metric.WithAttributes(t.table)
	t.beginAttrs = metric.WithAttributes(t.table, attribute.String("oncemill.store.operation", string(opBegin)))
	t.compAttrs = metric.WithAttributes(t.table, attribute.String("oncemill.store.operation", string(opComplete)))

	var err error
	if t.batchSize, err = m.Int64Histogram(MetricBatchSize,
		metric.WithUnit("{request}"),
		metric.WithDescription("Requests coalesced into one statement."),
		metric.WithExplicitBucketBoundaries(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)); err != nil {
		return nil, fmt.Errorf("postgres: metrics: %w", err)
	}
	if t.deleted, err = m.Int64Counter(MetricCleanupDeleted,
		metric.WithUnit("{record}"),
		metric.WithDescription("Expired records removed by cleanup.")); err != nil {
		return nil, fmt.Errorf("postgres: metrics: %w", err)
	}
	lag, err := m.Float64ObservableGauge(MetricCleanupLag,
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest expired record not yet removed, by the database clock; 0 when none."))
	if err != nil {
		return nil, fmt.Errorf("postgres: metrics: %w", err)
	}
	t.reg, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if s.isClosed() {
			return nil
		}
		v, err := s.CleanupLag(ctx)
		if err != nil {
			s.opts.Logger.Warn("oncemill: reading the cleanup lag failed", "error", err)
			return nil // no observation rather than a wrong one
		}
		o.ObserveFloat64(lag, v.Seconds(), t.tableAttrs)
		return nil
	}, lag)
	if err != nil {
		return nil, fmt.Errorf("postgres: metrics: %w", err)
	}
	return t, nil
}

func (t *telemetry) batch(ctx context.Context, op operation, n int) {
	attrs := t.beginAttrs
	if op == opComplete {
		attrs = t.compAttrs
	}
	t.batchSize.Record(ctx, int64(n), attrs)
}

func (t *telemetry) close() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}

// CleanupLag returns the age of the oldest expired record still in the table,
// by the database clock, or 0 when there is none. It is what the
// oncemill.store.cleanup.lag gauge reports.
func (s *Store) CleanupLag(ctx context.Context) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var secs float64
	if err := s.pool.QueryRow(ctx, s.sql.cleanupLag).Scan(&secs); err != nil {
		return 0, wrap("cleanup lag", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}
