package integration

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// checkServices fails when PostgreSQL, Redis or RabbitMQ does not answer.
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
	return errors.Join(errs...)
}

// redact hides the password of a URL-shaped address.
func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}
