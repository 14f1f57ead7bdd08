package redisstore_test

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// privateRedis is a redis-server that one benchmark started for itself, on
// a free 127.0.0.1 port, with no persistence: its process's CPU
// (testenv.PidCPU of pid) is its clients' alone, where the shared server's
// INFO counts every other client's commands too.
type privateRedis struct {
	addr string
	pid  int
}

// startPrivateRedis starts one, from ONCEMILL_BENCH_REDIS_SERVER (a
// redis-server or valkey-server binary) or the redis-server on PATH, and
// stops it when the benchmark ends, with args added to its command line. No
// server to start fails the benchmark.
func startPrivateRedis(tb testing.TB, args ...string) privateRedis {
	tb.Helper()
	bin, err := exec.LookPath(cmp.Or(os.Getenv("ONCEMILL_BENCH_REDIS_SERVER"), "redis-server"))
	if err != nil {
		tb.Fatalf("no Redis server binary (%v): install Redis 7 or later, or set ONCEMILL_BENCH_REDIS_SERVER", err)
	}
	dir := tb.TempDir()
	var lastErr error
	for range 5 { // another process may take the free port first
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		log := filepath.Join(dir, strconv.Itoa(port)+".log")
		cmd := exec.Command(bin, append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", log}, args...)...)
		if err := cmd.Start(); err != nil {
			tb.Fatalf("starting %s: %v", bin, err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		if lastErr = waitForPing(addr, exited); lastErr != nil {
			cmd.Process.Kill()
			<-exited
			out, _ := os.ReadFile(log)
			lastErr = fmt.Errorf("%w; its log:\n%s", lastErr, out)
			continue
		}
		tb.Cleanup(func() {
			cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(10 * time.Second):
				cmd.Process.Kill()
				<-exited
			}
		})
		return privateRedis{addr: addr, pid: cmd.Process.Pid}
	}
	tb.Fatalf("a private redis-server did not start: %v", lastErr)
	return privateRedis{}
}

// freePort is a 127.0.0.1 port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// waitForPing waits until the server at addr answers PING, or has exited.
func waitForPing(addr string, exited <-chan struct{}) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		err := c.Ping(ctx).Err()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("redis-server on %s exited", addr)
		case <-ctx.Done():
			return fmt.Errorf("redis-server on %s did not answer PING: %v", addr, err)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// writeCounter counts the writes of every connection dialed through its
// Dialer: one a flush of go-redis's buffer, so one a round trip for a
// command sent alone and one for a pipelined batch. It counts on the
// connection, not in a go-redis hook, because a process hook changes the
// full-duplex AutoPipeliner's path (a goroutine a command) and sees
// commands, not flushes.
type writeCounter struct{ writes atomic.Int64 }

func (w *writeCounter) dialer(ctx context.Context, network, addr string) (net.Conn, error) {
	conn, err := (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 5 * time.Minute}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: conn, writes: &w.writes}, nil
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// NetConn lets go-redis's connection check reach the TCP connection.
func (c countingConn) NetConn() net.Conn { return c.Conn }
