package redisstore_test

import (
	"context"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// replicated is a private primary with one private replica of it.
type replicated struct {
	primary, replica privateRedis
}

// startReplicated starts a primary and a replica of it, and waits until the
// replica is in sync.
func startReplicated(tb testing.TB) replicated {
	tb.Helper()
	// Diskless and at once: the first sync takes milliseconds, not the
	// default 5s delay.
	p := startPrivateRedis(tb, "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0")
	_, port, _ := net.SplitHostPort(p.addr)
	r := startPrivateRedis(tb, "--replicaof", "127.0.0.1", port)
	waitInSync(tb, p.addr, 1)
	return replicated{primary: p, replica: r}
}

// waitInSync waits until the primary at addr has n replicas online and
// acknowledging writes.
func waitInSync(tb testing.TB, addr string, n int) {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		// Online is not yet acknowledging: a diskless replica may still be
		// loading what it was sent, and answers the primary's GETACK only
		// then, so a WAIT of the test's own could time out. Wait for one
		// acknowledged write: WAIT counts the replicas that have the
		// connection's own last write, and on a connection that wrote
		// nothing returns at once, whatever the replicas acknowledged.
		if err == nil && strings.Count(info, "state=online") >= n {
			var acked *redis.Cmd
			if _, err := c.Pipelined(context.Background(), func(p redis.Pipeliner) error {
				p.Set(context.Background(), "oncemill-test:in-sync", 1, 0)
				acked = p.Do(context.Background(), "WAIT", n, 1000)
				return nil
			}); err == nil {
				if got, _ := acked.Int(); got >= n {
					return
				}
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s has not %d replica(s) online after 20s: %v\n%s", addr, n, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// pause stops the replica's process (SIGSTOP): the primary keeps it as
// connected, but it acknowledges nothing, as a replica cut off or stalled
// does. It resumes with the returned func, which returns once the replica
// acknowledges writes again (on a busy machine a resumed replica takes
// longer than the tests' WAIT bound to catch up), or when the test ends.
func (r replicated) pause(tb testing.TB) (resume func()) {
	tb.Helper()
	if err := syscall.Kill(r.replica.pid, syscall.SIGSTOP); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { syscall.Kill(r.replica.pid, syscall.SIGCONT) })
	return func() {
		tb.Helper()
		if err := syscall.Kill(r.replica.pid, syscall.SIGCONT); err != nil {
			tb.Fatal(err)
		}
		waitInSync(tb, r.primary.addr, 1)
	}
}
