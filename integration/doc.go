// Package integration runs oncemill end to end against real brokers and
// stores: Kafka (franz-go's kfake, in process), RabbitMQ through
// watermill-amqp v2 and v3, SQS (the fauxqs emulator, started from the
// lockfile in fauxqs/), NATS JetStream through watermill-nats v2, PostgreSQL
// in the one-transaction mode, and Redis. The consumers are real processes
// of the test rigs under cmd/ here (worker-rig, a fuller copy of
// cmd/example-worker, and oncemill-soak, the same worker with faults
// injected), so a crash is a SIGKILL, not a polite close.
//
// Run it with `go test ./integration/...`. PostgreSQL, Redis, RabbitMQ and
// NATS (with JetStream) must answer on 127.0.0.1 (or where
// ONCEMILL_POSTGRES_DSN, ONCEMILL_REDIS_ADDR, ONCEMILL_AMQP_URL and
// ONCEMILL_NATS_URL point); when one does not, the run fails and says
// which. Node.js and npm must be installed for fauxqs, unless
// ONCEMILL_SQS_ENDPOINT points at an SQS emulator that answers.
package integration
