// Package sentinel starts, for one test, a Redis primary, its replicas and
// a Sentinel that watches them, each on a free 127.0.0.1 port of its own,
// so that a test can kill the primary and watch Sentinel promote a
// replica. The test's cleanup kills them all; servers that a killed test
// run left behind are killed by their pid files when the next one starts.
package sentinel

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
)

// MasterName is the name Sentinel monitors the primary under.
const MasterName = "oncemill"

// pidDir holds a pid file per server of every run on the machine, named
// <the test process's pid>.<port>.pid: a file whose test process is gone
// names a leftover.
var pidDir = filepath.Join(os.TempDir(), "oncemill-sentinel-pids")

// Server is one redis-server process.
type Server struct {
	Addr   string
	Pid    int
	cmd    *exec.Cmd
	exited chan struct{}
	// links are the replication proxies from the primary to its replicas,
	// cut by Kill with it.
	links []*toxiproxy.Proxy
}

// Group is a primary with replicas and one Sentinel.
type Group struct {
	Sentinel *Server
	// Servers are the primary first, then the replicas, as started.
	Servers []*Server
	dir     string
}

// Start starts a primary, replicas replicas of it, and a Sentinel with
// quorum 1 that takes the primary for down after 1s without an answer.
// With a latency, each replica reaches the primary through a proxy that
// delays the replication stream by it, as a network between them would:
// killing the primary then loses the writes on their way.
func Start(t testing.TB, replicas int, latency time.Duration) *Group {
	t.Helper()
	bin, err := exec.LookPath(cmp.Or(os.Getenv("ONCEMILL_REDIS_SERVER"), "redis-server"))
	if err != nil {
		t.Fatalf("no redis-server (%v): install Redis 7, or set ONCEMILL_REDIS_SERVER", err)
	}
	killLeftovers(t)
	dir := t.TempDir()
	g := &Group{dir: dir}
	// Diskless sync at once: a replica is in sync in milliseconds.
	diskless := []string{"--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0"}
	primary := start(t, bin, dir, "primary", func(int) []string { return diskless })
	g.Servers = append(g.Servers, primary)
	_, pport, _ := net.SplitHostPort(primary.Addr)
	for i := range replicas {
		host, port := "127.0.0.1", pport
		if latency > 0 {
			link := replicationLink(t, primary.Addr, latency)
			primary.links = append(primary.links, link)
			host, port, _ = net.SplitHostPort(link.Listen)
		}
		g.Servers = append(g.Servers, start(t, bin, dir, fmt.Sprintf("replica-%d", i), func(int) []string {
			return append([]string{"--replicaof", host, port}, diskless...)
		}))
	}
	WaitReplicas(t, primary.Addr, replicas, 20*time.Second)
	g.Sentinel = start(t, bin, dir, "sentinel", func(port int) []string {
		conf := filepath.Join(dir, fmt.Sprintf("sentinel-%d.conf", port))
		// Sentinel rewrites its file, so each has one of its own.
		body := fmt.Sprintf("sentinel monitor %[1]s 127.0.0.1 %[2]s 1\n"+
			"sentinel down-after-milliseconds %[1]s 1000\n"+
			"sentinel failover-timeout %[1]s 5000\n"+
			"sentinel parallel-syncs %[1]s %[3]d\n", MasterName, pport, max(replicas, 1))
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return []string{conf, "--sentinel"}
	})
	// Sentinel finds the replicas through the primary's INFO, every 10s at
	// first: wait until it knows them, so that a kill can be failed over.
	c := redis.NewSentinelClient(&redis.Options{Addr: g.Sentinel.Addr})
	defer c.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r, err := c.Replicas(context.Background(), MasterName).Result()
		if err == nil && len(r) >= replicas {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Sentinel %s knows %d of %d replicas after 30s (%v)", g.Sentinel.Addr, len(r), replicas, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return g
}

// replicationLink is a proxy to the primary at addr that delays what the
// primary sends by latency.
func replicationLink(t testing.TB, addr string, latency time.Duration) *toxiproxy.Proxy {
	t.Helper()
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "replication", "127.0.0.1:0", addr)
	if err := p.Start(); err != nil {
		t.Fatalf("sentinel: starting a replication proxy: %v", err)
	}
	t.Cleanup(p.Stop)
	toxic := fmt.Sprintf(`{"name":"latency","type":"latency","stream":"downstream","toxicity":1,"attributes":{"latency":%d}}`, latency.Milliseconds())
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
		t.Fatalf("sentinel: adding the replication latency: %v", err)
	}
	return p
}

// start starts one server named name, with the flags args gives for its
// port, and stops it when the test ends. A port taken in the meantime is
// tried again with another. A Sentinel's args are its config file and
// --sentinel: it takes no persistence flags.
func start(t testing.TB, bin, dir, name string, args func(port int) []string) *Server {
	t.Helper()
	if err := os.MkdirAll(pidDir, 0o700); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for range 5 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		pidFile := filepath.Join(pidDir, fmt.Sprintf("%d.%d.pid", os.Getpid(), port))
		logFile := filepath.Join(dir, name+".log")
		extra := args(port)
		common := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir, "--logfile", logFile, "--pidfile", pidFile}
		var argv []string
		if slices.Contains(extra, "--sentinel") {
			argv = append(append([]string{extra[0]}, common...), "--sentinel")
		} else {
			argv = append(append(common, "--save", "", "--appendonly", "no"), extra...)
		}
		cmd := exec.Command(bin, argv...)
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", bin, err)
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Pid: cmd.Process.Pid, cmd: cmd, exited: make(chan struct{})}
		go func() { _ = cmd.Wait(); close(s.exited) }()
		if lastErr = waitPing(s); lastErr != nil {
			s.Kill()
			out, _ := os.ReadFile(logFile)
			lastErr = fmt.Errorf("%s: %w; its log:\n%s", name, lastErr, out)
			continue
		}
		t.Cleanup(func() {
			s.Kill()
			_ = os.Remove(pidFile)
		})
		return s
	}
	t.Fatalf("redis-server %s did not start: %v", name, lastErr)
	return nil
}

// waitPing waits until s answers PING, or has exited.
func waitPing(s *Server) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := c.Ping(context.Background()).Err()
		if err == nil {
			return nil
		}
		select {
		case <-s.exited:
			return fmt.Errorf("exited")
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no answer to PING: %v", err)
		}
	}
}

// Kill ends s with SIGKILL, at once, as a crashed host ends, and waits for
// it to exit; what its replication links hold is lost with it. Killing a
// dead server does nothing.
func (s *Server) Kill() {
	for _, l := range s.links {
		l.Stop()
	}
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.exited
}

// killLeftovers kills the servers whose test process has gone (killed
// before its cleanup ran), if they still run redis-server. Other runs'
// servers, on the machine at the same time, are left alone.
func killLeftovers(t testing.TB) {
	files, _ := filepath.Glob(filepath.Join(pidDir, "*.pid"))
	for _, f := range files {
		owner, _, _ := strings.Cut(filepath.Base(f), ".")
		if _, err := os.Stat("/proc/" + owner); err == nil {
			continue // its test is still running
		}
		if data, err := os.ReadFile(f); err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			cmdline, cerr := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			if err == nil && cerr == nil && bytes.Contains(cmdline, []byte("redis-server")) {
				t.Logf("killing redis-server %d, which the test process %s left (%s)", pid, owner, f)
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		_ = os.Remove(f)
	}
}

// WaitReplicas waits until the primary at addr has n replicas online.
func WaitReplicas(t testing.TB, addr string, n int, limit time.Duration) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(limit)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Count(info, "state=online") >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s has not %d replica(s) online after %v: %v\n%s", addr, n, limit, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Primary is the address Sentinel names for the primary now.
func (g *Group) Primary(ctx context.Context) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: g.Sentinel.Addr})
	defer c.Close()
	a, err := c.GetMasterAddrByName(ctx, MasterName).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(a[0], a[1]), nil
}

// Switches are the lines of Sentinel's log that name a new primary
// (+switch-master) or give a failover up (-failover-abort-*): more than
// one switch is a second failover.
func (g *Group) Switches() []string {
	var out []string
	data, _ := os.ReadFile(filepath.Join(g.dir, "sentinel.log"))
	for line := range strings.Lines(string(data)) {
		if strings.Contains(line, "+switch-master") || strings.Contains(line, "-failover-abort") {
			out = append(out, strings.TrimSpace(line))
		}
	}
	return out
}

// Server is the server at addr.
func (g *Group) Server(addr string) *Server {
	for _, s := range g.Servers {
		if s.Addr == addr {
			return s
		}
	}
	return nil
}

// WaitFailover waits until Sentinel names a primary other than old, and
// that server answers as a primary, and returns its address.
func (g *Group) WaitFailover(t testing.TB, old string, limit time.Duration) string {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		addr, err := g.Primary(context.Background())
		if err == nil && addr != old {
			c := redis.NewClient(&redis.Options{Addr: addr})
			role, rerr := c.Do(context.Background(), "role").Slice()
			c.Close()
			if rerr == nil && len(role) > 0 && role[0] == "master" {
				return addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("Sentinel named no new primary within %v of the kill of %s (now %s, %v)", limit, old, addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
