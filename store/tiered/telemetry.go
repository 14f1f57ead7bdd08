package tiered

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names (the package documentation and docs/observability.md list them).
const (
	// metricFallbacks counts the Redis calls the store went on without:
	// failed, timed out, or skipped while Redis was backed off
	// (Options.RedisBackoff). Attribute operation: begin and claim (a read
	// that the truth answered instead), complete, commit and
	// record_rollback (a fill dropped), release and record_rollback (a
	// removal left to the record's own TTL). A Delete that cannot reach
	// Redis fails instead, and is not counted.
	metricFallbacks = "oncemill.store.tier.fallbacks"
	// metricReplays counts the ClaimLease and Claim calls answered with a
	// finished record (a replay or a mismatch), by the tier that answered:
	// attribute tier = local, redis or truth.
	metricReplays = "oncemill.store.tier.replays"
)

const meterName = "github.com/oncemill/oncemill/store/tiered"

// op names the store operation a fallback happened in.
type op int

const (
	opBegin op = iota
	opClaim
	opComplete
	opCommit
	opRecordRollback
	opRelease
	ops
)

var opNames = [ops]string{"begin", "claim", "complete", "commit", "record_rollback", "release"}

// tier names who answered a replay.
type tier int

const (
	tierLocal tier = iota
	tierRedis
	tierTruth
	tiers
)

var tierNames = [tiers]string{"local", "redis", "truth"}

type telemetry struct {
	fallbacks, replays metric.Int64Counter
	// Option slices built once: a prebuilt slice passed to a variadic Add
	// allocates nothing on the replay path.
	opAttrs   [ops][]metric.AddOption
	tierAttrs [tiers][]metric.AddOption
}

func newTelemetry(mp metric.MeterProvider) (*telemetry, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(meterName)
	t := &telemetry{}
	var err error
	if t.fallbacks, err = m.Int64Counter(metricFallbacks, metric.WithUnit("{call}"),
		metric.WithDescription("Redis calls the tiered store went on without (failed, timed out, or skipped while Redis was backed off), by operation.")); err != nil {
		return nil, fmt.Errorf("oncemill: tiered: metrics: %w", err)
	}
	if t.replays, err = m.Int64Counter(metricReplays, metric.WithUnit("{call}"),
		metric.WithDescription("ClaimLease and Claim calls answered with a finished record, by the tier that answered: local, redis or truth.")); err != nil {
		return nil, fmt.Errorf("oncemill: tiered: metrics: %w", err)
	}
	for o, name := range opNames {
		t.opAttrs[o] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("operation", name)))}
	}
	for i, name := range tierNames {
		t.tierAttrs[i] = []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("tier", name)))}
	}
	return t, nil
}

func (t *telemetry) fellBack(ctx context.Context, o op) { t.fallbacks.Add(ctx, 1, t.opAttrs[o]...) }
func (t *telemetry) replayed(ctx context.Context, from tier) {
	t.replays.Add(ctx, 1, t.tierAttrs[from]...)
}
