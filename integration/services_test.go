package integration

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// checkServices fails when PostgreSQL, Redis, RabbitMQ or NATS (with
// JetStream) does not answer.
// They are the machine's own services; nothing here starts them, and no
// test is skipped without them.
func checkServices() error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var errs []error

	if conn, err := pgx.Connect(ctx, env.postgresDSN); err != nil {
		errs = append(errs, fmt.Errorf("PostgreSQL at %s does not answer (%w); start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start", redact(env.postgresDSN), err))
	} else {
		_ = conn.Close(ctx)
	}

	rdb := redis.NewClient(&redis.Options{Addr: env.redisAddr})
	if err := rdb.Ping(ctx).Err(); err != nil {
		errs = append(errs, fmt.Errorf("Redis at %s does not answer (%w); start it with: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save \"\" --appendonly no", env.redisAddr, err))
	}
	_ = rdb.Close()

	if conn, err := amqp091.DialConfig(env.amqpURL, amqp091.Config{Dial: amqp091.DefaultDial(5 * time.Second)}); err != nil {
		errs = append(errs, fmt.Errorf("RabbitMQ at %s does not answer (%w); start it with: rabbitmq-server -detached, then wait for: rabbitmqctl -q await_startup", redact(env.amqpURL), err))
	} else {
		_ = conn.Close()
	}

	if err := natsAnswers(ctx); err != nil {
		errs = append(errs, fmt.Errorf("NATS with JetStream at %s does not answer (%w); start it with: start-stop-daemon --start --oknodo --background --exec /usr/sbin/nats-server -- -a 127.0.0.1 -p 4222 -js -sd /var/lib/nats-server -l /var/log/nats-server.log", redact(env.natsURL), err))
	}
	return errors.Join(errs...)
}

// natsAnswers connects and asks JetStream for the account's limits, which
// fails unless the server runs with JetStream.
func natsAnswers(ctx context.Context) error {
	nc, err := nats.Connect(env.natsURL, nats.Timeout(5*time.Second))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := nc.JetStream(nats.Context(ctx))
	if err != nil {
		return err
	}
	_, err = js.AccountInfo()
	return err
}

// redact hides the password of a URL-shaped address.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}
