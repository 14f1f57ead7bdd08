// Package cleanupmetrics registers the cleanup metrics the SQL stores
// share, under one set of names so that one dashboard reads every store.
// Every instrument carries the attribute oncemill.store.table, the store's
// table.
package cleanupmetrics

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

const (
	// Lag is an observable gauge, in seconds: how long the oldest row
	// cleanup may remove has waited for it (the database clock minus its
	// purge time), 0 when none is left. Below the cleanup interval is
	// healthy; a steady rise means cleanup is not keeping up or not
	// running.
	Lag = "oncemill.store.cleanup.lag"
	// Deleted counts rows removed by cleanup.
	Deleted = "oncemill.store.cleanup.deleted"
)

// Metrics are one store's cleanup instruments.
type Metrics struct {
	deleted metric.Int64Counter
	reg     metric.Registration
	attrs   metric.MeasurementOption
}

// Register registers the instruments of the store whose meter is
// meterName, for table, with mp (nil: otel.GetMeterProvider()). The gauge
// reads lag while closed says the store is open; a failed read is logged
// and observes nothing, rather than a wrong value.
func Register(mp metric.MeterProvider, meterName, table string, lag func(context.Context) (time.Duration, error), closed func() bool, logger *slog.Logger) (*Metrics, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	meter := mp.Meter(meterName)
	m := &Metrics{attrs: metric.WithAttributes(attribute.String("oncemill.store.table", table))}
	var err error
	if m.deleted, err = meter.Int64Counter(Deleted,
		metric.WithUnit("{record}"),
		metric.WithDescription("Expired records removed by cleanup.")); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	gauge, err := meter.Float64ObservableGauge(Lag,
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest expired record not yet removed, by the database clock; 0 when none."))
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	m.reg, err = meter.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		if closed() {
			return nil
		}
		v, err := lag(ctx)
		if err != nil {
			logger.Warn("oncemill: reading the cleanup lag failed", "error", err)
			return nil
		}
		o.ObserveFloat64(gauge, v.Seconds(), m.attrs)
		return nil
	}, gauge)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	return m, nil
}

// Removed counts n rows removed by cleanup.
func (m *Metrics) Removed(ctx context.Context, n int) {
	m.deleted.Add(ctx, int64(n), m.attrs)
}

// Close stops the gauge's observations.
func (m *Metrics) Close() {
	_ = m.reg.Unregister()
}
