// Package deploy holds what an operator deploys next to a service that uses
// oncemill: a Grafana dashboard (grafana/oncemill.json) and Prometheus alert
// rules (prometheus/oncemill-rules.yml), on the names the OpenTelemetry
// Prometheus exporter gives the library's metrics. Its test runs a receiver
// over the PostgreSQL store, and a MySQL store, through that exporter and fails when an
// expression in either file names a metric, label or label value the
// library does not export. It is a module of its own so that the Prometheus
// parser it needs stays out of the library's requirements.
package deploy
