// Package exampletest holds what the tests of the example programs share:
// their services' addresses, unique names, a log buffer to wait on, and
// bounded polling. The programs themselves do not use it; they stay
// self-contained, to be copied.
//
// No test skips: a service that does not answer fails the test, with the
// command that starts it.
package exampletest

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
)

// The services, as the examples' own defaults, overridden by the variables
// the repository's other tests read.
var (
	PostgresDSN = cmp.Or(os.Getenv("ONCEMILL_POSTGRES_DSN"), "postgres://postgres@127.0.0.1:5432/test")
	RedisAddr   = cmp.Or(os.Getenv("ONCEMILL_REDIS_ADDR"), "127.0.0.1:6379")
	AMQPURL     = cmp.Or(os.Getenv("ONCEMILL_AMQP_URL"), "amqp://guest:guest@127.0.0.1:5672/")
)

// Name returns prefix followed by a random lower-case suffix: a table,
// schema, queue, topic or key prefix of this test run alone.
func Name(prefix string) string {
	return prefix + strings.ToLower(rand.Text()[:12])
}

// Postgres connects to PostgreSQL and returns a pool (closed when the test
// ends) and a fresh schema name, whose schema is dropped when the test ends.
func Postgres(t *testing.T) (*pgxpool.Pool, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pool, err := pgxpool.New(ctx, PostgresDSN)
	if err == nil {
		err = pool.Ping(ctx)
	}
	if err != nil {
		t.Fatalf("PostgreSQL at %s does not answer (%v); start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start, or set ONCEMILL_POSTGRES_DSN", redact(PostgresDSN), err)
	}
	schema := Name("oncemill_example_")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema %s: %v", schema, err)
		}
		pool.Close()
	})
	return pool, schema
}

// Redis connects to Redis, failing the test if it does not answer. When the
// test ends it deletes every key under prefix and closes the client.
func Redis(t *testing.T, prefix string) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: RedisAddr})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		t.Fatalf("Redis at %s does not answer (%v); start it with: redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save \"\" --appendonly no, or set ONCEMILL_REDIS_ADDR", RedisAddr, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		iter := rdb.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			rdb.Del(ctx, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("deleting Redis keys %s*: %v", prefix, err)
		}
		_ = rdb.Close()
	})
	return rdb
}

// RabbitMQ checks that RabbitMQ answers, failing the test if it does not,
// and deletes queue when the test ends.
func RabbitMQ(t *testing.T, queue string) {
	t.Helper()
	dial := func() *amqp091.Connection {
		t.Helper()
		conn, err := amqp091.DialConfig(AMQPURL, amqp091.Config{Dial: amqp091.DefaultDial(5 * time.Second)})
		if err != nil {
			t.Fatalf("RabbitMQ at %s does not answer (%v); start it with: rabbitmq-server -detached, then rabbitmqctl -q await_startup, or set ONCEMILL_AMQP_URL", redact(AMQPURL), err)
		}
		return conn
	}
	_ = dial().Close()
	t.Cleanup(func() {
		conn := dial()
		defer conn.Close()
		ch, err := conn.Channel()
		if err == nil {
			_, err = ch.QueueDelete(queue, false, false, false)
		}
		if err != nil {
			t.Errorf("deleting queue %s: %v", queue, err)
		}
	})
}

// Log is a buffer that a program under test logs to while the test reads
// it: safe for concurrent use.
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Count is how many lines hold every one of parts.
func (l *Log) Count(parts ...string) int {
	n := 0
	for line := range strings.Lines(l.String()) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

// Eventually polls cond every 50ms until it returns true, and fails the test
// with what (and the log, when not nil) if that takes longer than timeout.
// cond may return an error to fail at once: a program that exited, say.
func Eventually(t *testing.T, timeout time.Duration, log *Log, what string, cond func() (bool, error)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, err := cond()
		switch {
		case ok:
			return
		case err != nil:
			t.Fatalf("waiting for %s: %v%s", what, err, dump(log))
		case time.Now().After(deadline):
			t.Fatalf("%s did not happen within %v%s", what, timeout, dump(log))
		}
		<-tick.C
	}
}

func dump(log *Log) string {
	if log == nil {
		return ""
	}
	return "\nthe program's log:\n" + log.String()
}

// CountRows returns how many rows of table (schema-qualified, sanitized)
// each message_uuid has.
func CountRows(t *testing.T, pool *pgxpool.Pool, table string) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rows, err := pool.Query(ctx, "SELECT message_uuid, count(*) FROM "+table+" GROUP BY message_uuid")
	if err != nil {
		t.Fatalf("counting rows of %s: %v", table, err)
	}
	counts := map[string]int{}
	for rows.Next() {
		var uuid string
		var n int
		if err := rows.Scan(&uuid, &n); err != nil {
			t.Fatal(err)
		}
		counts[uuid] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("counting rows of %s: %v", table, err)
	}
	return counts
}

// ExactlyOnce fails the test unless got has exactly one row for each uuid
// of want and nothing else.
func ExactlyOnce(t *testing.T, got map[string]int, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("rows for %d messages, want %d: %v", len(got), len(want), got)
	}
	for _, uuid := range want {
		if got[uuid] != 1 {
			t.Errorf("message %s has %d rows, want exactly 1 (all: %v)", uuid, got[uuid], got)
		}
	}
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.User == nil {
		return s
	}
	return u.Redacted()
}

// Fatalf is t.Fatalf with the log appended.
func Fatalf(t *testing.T, log *Log, format string, args ...any) {
	t.Helper()
	t.Fatalf("%s%s", fmt.Sprintf(format, args...), dump(log))
}

// Program is a program's run function running on a goroutine of the test.
type Program struct {
	t      *testing.T
	log    *Log
	cancel context.CancelFunc
	done   chan struct{}
	err    error
}

// Start calls run on a goroutine with a context that Stop cancels; it is
// cancelled too when the test ends.
func Start(t *testing.T, log *Log, run func(ctx context.Context) error) *Program {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Program{t: t, log: log, cancel: cancel, done: make(chan struct{})}
	go func() { p.err = run(ctx); close(p.done) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-p.done:
		case <-time.After(time.Minute):
			t.Errorf("run did not return within a minute of its context ending")
		}
	})
	return p
}

// Exited returns an error once run has returned: for Eventually, so that
// waiting for a program that gave up fails at once.
func (p *Program) Exited() error {
	select {
	case <-p.done:
		return fmt.Errorf("run returned early: %v", p.err)
	default:
		return nil
	}
}

// Stop cancels run's context and fails the test unless run then returns
// nil within a minute.
func (p *Program) Stop() {
	p.t.Helper()
	p.cancel()
	select {
	case <-p.done:
		if p.err != nil {
			Fatalf(p.t, p.log, "run: %v", p.err)
		}
	case <-time.After(time.Minute):
		Fatalf(p.t, p.log, "run did not return within a minute of its context ending")
	}
}
