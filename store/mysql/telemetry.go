package mysql

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names, the PostgreSQL store's, so that one dashboard reads both.
// Every instrument carries the attribute oncemill.store.table = the table
// (Options.Table, in the connection's database).
const (
	// metricCleanupLag is an observable gauge, in seconds: how long the
	// oldest row cleanup may remove has waited for it (the server clock
	// minus its purge time), 0 when none is left. Below the cleanup
	// interval is healthy; a steady rise means cleanup is not keeping up
	// or not running.
	metricCleanupLag = "oncemill.store.cleanup.lag"
	// metricCleanupDeleted counts rows removed by cleanup.
	metricCleanupDeleted = "oncemill.store.cleanup.deleted"
)

const meterName = "github.com/oncemill/oncemill/store/mysql"

type telemetry struct {
	deleted    metric.Int64Counter
	reg        metric.Registration
	tableAttrs metric.MeasurementOption
}

// newTelemetry registers the store's instruments for table with mp (nil:
// otel.GetMeterProvider()); the gauge reads lag while closed says the
// store is open.
func newTelemetry(mp metric.MeterProvider, table string, lag func(context.Context) (time.Duration, error), closed func() bool, logger *slog.Logger) (*telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(meterName)
	t := &telemetry{tableAttrs: metric.WithAttributes(attribute.String("oncemill.store.table", table))}
	var err error
	if t.deleted, err = m.Int64Counter(metricCleanupDeleted,
		metric.WithUnit("{record}"),
		metric.WithDescription("Expired records removed by cleanup.")); err != nil {
		return nil, fmt.Errorf("oncemill: mysql: metrics: %w", err)
	}
	gauge, err := m.Float64ObservableGauge(metricCleanupLag,
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest expired record not yet removed, by the database clock; 0 when none."))
	if err != nil {
		return nil, fmt.Errorf("oncemill: mysql: metrics: %w", err)
	}
	t.reg, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if closed() {
			return nil
		}
		v, err := lag(ctx)
		if err != nil {
			logger.Warn("oncemill: reading the cleanup lag failed", "error", err)
			return nil // no observation rather than a wrong one
		}
		o.ObserveFloat64(gauge, v.Seconds(), t.tableAttrs)
		return nil
	}, gauge)
	if err != nil {
		return nil, fmt.Errorf("oncemill: mysql: metrics: %w", err)
	}
	return t, nil
}

func (t *telemetry) close() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}

// cleanupLag is what the oncemill.store.cleanup.lag gauge reports: how
// long the oldest record cleanup may remove has waited for it, by the
// server clock, or 0 when there is none.
func (s *Store) cleanupLag(ctx context.Context) (time.Duration, error) {
	ctx, cancel, err := s.gate.Enter(ctx, "cleanup lag", 0)
	if err != nil {
		return 0, err
	}
	defer s.gate.Leave(cancel)
	var lag int64
	if err := s.db.QueryRowContext(ctx, s.sql.cleanupLag).Scan(&lag); err != nil {
		return 0, wrap("cleanup lag", err)
	}
	return time.Duration(lag) * time.Microsecond, nil
}
