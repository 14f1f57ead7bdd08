package postgres

import (
	"context"
	"fmt"
	"log/slog"
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

// newTelemetry registers the store's instruments for table ("schema.table")
// with mp (nil: otel.GetMeterProvider()); the gauge reads lag while closed
// says the store is open.
func newTelemetry(mp metric.MeterProvider, table string, lag func(context.Context) (time.Duration, error), closed func() bool, logger *slog.Logger) (*telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(meterName)
	t := &telemetry{table: attribute.String("oncemill.store.table", table)}
	t.tableAttrs = metric.WithAttributes(t.table)

	var err error
	if t.deleted, err = m.Int64Counter(metricCleanupDeleted,
		metric.WithUnit("{record}"),
		metric.WithDescription("Expired records removed by cleanup.")); err != nil {
		return nil, fmt.Errorf("oncemill: postgres: metrics: %w", err)
	}
	gauge, err := m.Float64ObservableGauge(metricCleanupLag,
		metric.WithUnit("s"),
		metric.WithDescription("Age of the oldest expired record not yet removed, by the database clock; 0 when none."))
	if err != nil {
		return nil, fmt.Errorf("oncemill: postgres: metrics: %w", err)
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
		return nil, fmt.Errorf("oncemill: postgres: metrics: %w", err)
	}
	return t, nil
}

func (t *telemetry) close() {
	if t.reg != nil {
		_ = t.reg.Unregister()
	}
}
