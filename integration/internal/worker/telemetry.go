package worker

// Metrics and traces of the deployable worker: oncemill's OpenTelemetry
// metrics exported to Prometheus on /metrics, and spans sent over OTLP/HTTP
// (to Jaeger in docker-compose.yml) when an endpoint is set.

import (
	"context"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	"go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
)

// Telemetry is the worker's metrics (Prometheus registry) and traces.
type Telemetry struct {
	registry *prometheus.Registry
	meters   *metric.MeterProvider
	tracer   *trace.TracerProvider // nil: no traces exported
}

func newTelemetry(ctx context.Context, cfg Config) (*Telemetry, error) {
	res := resource.NewSchemaless(semconv.ServiceName("oncemill-example-worker"))
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	exp, err := otelprom.New(otelprom.WithRegisterer(reg))
	if err != nil {
		return nil, fmt.Errorf("prometheus exporter: %w", err)
	}
	t := &Telemetry{registry: reg, meters: metric.NewMeterProvider(metric.WithReader(exp), metric.WithResource(res))}
	if cfg.OTLPEndpoint != "" {
		spans, err := otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(cfg.OTLPEndpoint+"/v1/traces"))
		if err != nil {
			return nil, fmt.Errorf("otlp exporter (%s): %w", cfg.OTLPEndpoint, err)
		}
		t.tracer = trace.NewTracerProvider(trace.WithBatcher(spans), trace.WithResource(res))
	}
	return t, nil
}

// shutdown flushes what is buffered.
func (t *Telemetry) shutdown(ctx context.Context) error {
	errs := []error{t.meters.Shutdown(ctx)}
	if t.tracer != nil {
		errs = append(errs, t.tracer.Shutdown(ctx))
	}
	return errors.Join(errs...)
}
