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
	// metricCleanupLag is an observable gauge, in seconds: how long the
	// oldest row cleanup may remove has waited for it (now() − its purge
	// time, by the database clock), 0 when none is left. Below the
	// cleanup interval is healthy; a steady rise means cleanup is not
	// keeping up or not running.
	metricCleanupLag = "oncemill.store.cleanup.lag"
	// metricCleanupDeleted counts rows removed by cleanup.
	metricCleanupDeleted = "oncemill.store.cleanup.deleted"
)

const meterName = "github.com/oncemill/oncemill/store/postgres"

type telemetry struct {
	table      attribute.KeyValue
	deleted    metric.Int64Counter
	reg        metric.Registration
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

	var err error
	if t.deleted, err = m.Int64Counter(metricCleanupDeleted,
		metric.WithUnit("{record}"),
		metric.WithDescription("Expired records removed by cleanup.")); err != nil {
		return nil, fmt.Errorf("oncemill: postgres: metrics: %w", err)
	}
	lag, err := m.Float64ObservableGauge(metricCleanupLag,
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest expired record not yet removed, by the database clock; 0 when none."))
	if err != nil {
		return nil, fmt.Errorf("oncemill: postgres: metrics: %w", err)
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
		return nil, fmt.Errorf("oncemill: postgres: metrics: %w", err)
	}
	return t, nil
}

func (t *telemetry) close() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}

// CleanupLag returns how long the oldest record that cleanup may remove has
// waited for it, by the database clock, or 0 when there is none. It is what the
// oncemill.store.cleanup.lag gauge reports. In the partitioned layout, which
// has no purge_at index to find that record, it is how long the oldest
// partition has outlived the time it was due to go (partitionLag).
func (s *Store) CleanupLag(ctx context.Context) (time.Duration, error) {
	ctx, cancel, err := s.enter(ctx, "cleanup lag", 0)
	if err != nil {
		return 0, err
	}
	defer s.leave(cancel)
	if s.opts.Layout == LayoutPartitioned {
		return s.partitionLag(ctx)
	}
	var secs float64
	if err := s.pool.QueryRow(ctx, s.sql.cleanupLag).Scan(&secs); err != nil {
		return 0, wrap("cleanup lag", err)
	}
	return time.Duration(secs * float64(time.Second)), nil
}

// partitionLag is the partitioned layout's cleanup lag, read from the
// catalog alone, with now(), in one round trip: how long ago the oldest partition was due to be dropped,
// or 0. A partition is due one retention (Options.Retention) and one width
// after its range ends: by then every row claimed in it is past its purge
// time, unless a lease or an outcome TTL outlived the retention. A steady
// rise means the upkeep is not running, its drops keep timing out, or rows
// live longer than Options.Retention says.
func (s *Store) partitionLag(ctx context.Context) (time.Duration, error) {
	now, parts, err := s.listPartitions(ctx, s.pool)
	if err != nil {
		return 0, wrap("cleanup lag", err)
	}
	parts = inTable(parts)
	if len(parts) == 0 {
		return 0, nil
	}
	return max(now.Sub(parts[0].upper.Add(s.opts.Retention+s.width)), 0), nil
}
