// Package pgpair runs a PostgreSQL primary and a streaming standby of its
// own on 127.0.0.1, for the failover tests: the machine's PostgreSQL 15
// binaries, two clusters in a temporary directory, trust authentication,
// the standby made with pg_basebackup -R, replication synchronous or not.
// The servers run as the postgres OS user, which PostgreSQL requires of a
// root caller.
package pgpair

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
)

// BinDir holds initdb, pg_ctl and pg_basebackup.
var BinDir = "/usr/lib/postgresql/15/bin"

// StandbyName is the standby's cluster_name, hence its application_name
// at the primary, which synchronous_standby_names names.
const StandbyName = "oncemill_standby"

// Database is created on the primary before the standby is copied.
const Database = "test"

// root holds one directory per test process, run-<pid>-*: a process that
// died without its cleanup leaves servers there, which the next Start
// stops (sweep).
var root = filepath.Join(os.TempDir(), "oncemill-pgpair")

// Options say how the standby replicates.
type Options struct {
	// Sync makes the standby synchronous: synchronous_standby_names names
	// it, and synchronous_commit is on.
	Sync bool
	// Latency delays the WAL on its way to the standby, through a proxy:
	// a standby across a network. KillPrimary cuts the proxy with the
	// kill, so what was on the way is lost, as when the primary's machine
	// dies.
	Latency time.Duration
}

// Pair is a primary and its standby.
type Pair struct {
	t           testing.TB
	dir         string
	opts        Options
	proxy       *toxiproxy.Proxy // between the standby and the primary; nil without Latency
	PrimaryPort int
	StandbyPort int
	primaryData string
	standbyData string
}

// Lag is the standby's position when the primary was killed.
type Lag struct {
	// PrimaryLSN is pg_current_wal_lsn() just before the kill.
	PrimaryLSN string
	// ReplayBytes is how far the standby's replay was behind PrimaryLSN at
	// that moment, and ReplayLag pg_stat_replication's replay_lag (0 when
	// the standby had caught up, which PostgreSQL reports as NULL).
	ReplayBytes int64
	ReplayLag   time.Duration
	// MissingBytes is how much of the WAL up to PrimaryLSN the standby had
	// not received after the kill: 0 when it had it all. (The primary went
	// on writing between the reading and the kill, so this bounds the loss
	// from below.)
	MissingBytes int64
}

var sweepOnce sync.Once

// Start starts a primary and a standby, waits until the standby streams
// (and, when opts.Sync, is the synchronous one), and stops both and
// removes their directories in t's cleanup.
func Start(t testing.TB, opts Options) *Pair {
	t.Helper()
	sweepOnce.Do(sweep)
	uid, gid, err := postgresUser()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(root, fmt.Sprintf("run-%d-", os.Getpid()))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(dir, uid, gid); err != nil {
		t.Fatal(err)
	}
	p := &Pair{t: t, dir: dir, opts: opts, primaryData: filepath.Join(dir, "primary"), standbyData: filepath.Join(dir, "standby")}
	t.Cleanup(p.stop)
	if p.PrimaryPort, err = freePort(); err != nil {
		t.Fatal(err)
	}
	if p.StandbyPort, err = freePort(); err != nil {
		t.Fatal(err)
	}

	p.run("initdb", "-D", p.primaryData, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	conf := fmt.Sprintf(`
listen_addresses = '127.0.0.1'
unix_socket_directories = '%s'
wal_level = replica
max_wal_senders = 5
wal_keep_size = '256MB'
hot_standby = on
fsync = off
full_page_writes = off
max_connections = 100
shared_buffers = '32MB'
`, dir)
	// fsync off: the kill is of the process (-m immediate), not of the
	// machine, so what the kernel holds survives it; replication is what
	// the failover tests measure.
	p.appendFile(filepath.Join(p.primaryData, "postgresql.conf"), conf)
	p.appendFile(filepath.Join(p.primaryData, "pg_hba.conf"),
		"host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n")
	p.run("pg_ctl", "-D", p.primaryData, "-o", fmt.Sprintf("-p %d", p.PrimaryPort), "-l", filepath.Join(dir, "primary.log"), "-w", "-t", "60", "start")
	p.exec(p.PrimaryDSN("postgres"), "CREATE DATABASE "+Database)

	// -R writes primary_conninfo and standby.signal; the standby's
	// cluster_name is its application_name at the primary. The copy is
	// taken before synchronous_standby_names is set, so the standby, once
	// promoted, waits for no standby of its own.
	// With a latency the copy is taken through the proxy, so that -R
	// points the standby at it; the latency comes after the copy.
	upstream := p.PrimaryPort
	if opts.Latency > 0 {
		srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
		p.proxy = toxiproxy.NewProxy(srv, "replication", "127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", p.PrimaryPort))
		if err := p.proxy.Start(); err != nil {
			t.Fatalf("pgpair: starting the replication proxy: %v", err)
		}
		t.Cleanup(p.proxy.Stop)
		_, portText, _ := net.SplitHostPort(p.proxy.Listen)
		upstream, _ = strconv.Atoi(portText)
	}
	p.run("pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(upstream), "-U", "postgres", "-D", p.standbyData, "-R", "-X", "stream", "-c", "fast", "--no-sync")
	if opts.Latency > 0 {
		toxic := fmt.Sprintf(`{"name":"latency","type":"latency","stream":"downstream","toxicity":1,"attributes":{"latency":%d}}`, opts.Latency.Milliseconds())
		if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(toxic)); err != nil {
			t.Fatalf("pgpair: adding the replication latency: %v", err)
		}
	}
	p.appendFile(filepath.Join(p.standbyData, "postgresql.conf"), fmt.Sprintf("\ncluster_name = '%s'\n", StandbyName))
	p.run("pg_ctl", "-D", p.standbyData, "-o", fmt.Sprintf("-p %d", p.StandbyPort), "-l", filepath.Join(dir, "standby.log"), "-w", "-t", "60", "start")

	if opts.Sync {
		p.exec(p.PrimaryDSN("postgres"), "ALTER SYSTEM SET synchronous_standby_names = '"+StandbyName+"'")
		p.exec(p.PrimaryDSN("postgres"), "ALTER SYSTEM SET synchronous_commit = on")
		p.exec(p.PrimaryDSN("postgres"), "SELECT pg_reload_conf()")
	}
	want := "async"
	if opts.Sync {
		want = "sync"
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		state := p.queryString(p.PrimaryDSN("postgres"),
			"SELECT coalesce((SELECT state || '/' || sync_state FROM pg_stat_replication WHERE application_name = $1), '')", StandbyName)
		if state == "streaming/"+want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgpair: the standby is %q at the primary after 60 s, want streaming/%s; standby log:\n%s", state, want, p.log("standby"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	return p
}

// DSN is the multi-host connection string the workers use: the primary,
// then the standby, the first that accepts writes.
func (p *Pair) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/%s?target_session_attrs=read-write&connect_timeout=2",
		p.PrimaryPort, p.StandbyPort, Database)
}

// PrimaryDSN and StandbyDSN reach one server, in database db.
func (p *Pair) PrimaryDSN(db string) string { return dsn(p.PrimaryPort, db) }
func (p *Pair) StandbyDSN(db string) string { return dsn(p.StandbyPort, db) }

func dsn(port int, db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?connect_timeout=5", port, db)
}

// KillPrimary reads the replication positions, stops the primary with
// pg_ctl -m immediate (no shutdown checkpoint, no WAL sent after it: a
// crash), and returns where the standby was.
func (p *Pair) KillPrimary() Lag {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, p.PrimaryDSN("postgres"))
	if err != nil {
		p.t.Fatalf("pgpair: connecting to the primary before the kill: %v", err)
	}
	var lag Lag
	var replayLag *float64 // seconds
	err = conn.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text,
	coalesce((SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)::bigint FROM pg_stat_replication WHERE application_name = $1), -1),
	(SELECT extract(epoch FROM replay_lag)::float8 FROM pg_stat_replication WHERE application_name = $1)`, StandbyName).Scan(&lag.PrimaryLSN, &lag.ReplayBytes, &replayLag)
	_ = conn.Close(ctx)
	if err != nil {
		p.t.Fatalf("pgpair: reading the primary's position: %v", err)
	}
	if replayLag != nil {
		lag.ReplayLag = time.Duration(*replayLag * float64(time.Second))
	}
	if p.proxy != nil {
		p.proxy.Stop() // what is on its way to the standby is lost
	}
	p.run("pg_ctl", "-D", p.primaryData, "-m", "immediate", "-w", "stop")
	// What the standby received of the WAL up to PrimaryLSN.
	if err := queryRow(p.StandbyDSN("postgres"), "SELECT greatest(pg_wal_lsn_diff($1::pg_lsn, pg_last_wal_receive_lsn()), 0)::bigint",
		[]any{lag.PrimaryLSN}, &lag.MissingBytes); err != nil {
		p.t.Fatalf("pgpair: reading the standby's position after the kill: %v", err)
	}
	return lag
}

// Promote makes the standby a primary and waits until it accepts writes.
func (p *Pair) Promote() {
	p.t.Helper()
	p.run("pg_ctl", "-D", p.standbyData, "-w", "-t", "60", "promote")
	deadline := time.Now().Add(30 * time.Second)
	for p.queryString(p.StandbyDSN("postgres"), "SELECT pg_is_in_recovery()::text") != "false" {
		if time.Now().After(deadline) {
			p.t.Fatal("pgpair: the standby is still in recovery 30 s after pg_ctl promote")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop stops both servers, the fastest way, and removes their directory.
func (p *Pair) stop() {
	if p.t.Failed() {
		p.t.Logf("pgpair: primary log:\n%s\nstandby log:\n%s", p.log("primary"), p.log("standby"))
	}
	stopDir(p.dir)
}

// log is the tail of a server's log file.
func (p *Pair) log(name string) string {
	data, _ := os.ReadFile(filepath.Join(p.dir, name+".log"))
	if len(data) > 4000 {
		data = data[len(data)-4000:]
	}
	return string(data)
}

// stopDir stops the servers of a run directory (pg_ctl -m immediate; a
// SIGKILL of the postmaster if that fails) and removes it.
func stopDir(dir string) {
	for _, data := range []string{filepath.Join(dir, "primary"), filepath.Join(dir, "standby")} {
		pidFile := filepath.Join(data, "postmaster.pid")
		raw, err := os.ReadFile(pidFile)
		if err != nil {
			continue // never started, or stopped
		}
		if err := asPostgres("pg_ctl", "-D", data, "-m", "immediate", "-w", "-t", "10", "stop").Run(); err == nil {
			continue
		}
		first, _, _ := strings.Cut(string(raw), "\n")
		if pid, err := strconv.Atoi(strings.TrimSpace(first)); err == nil && pid > 1 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	_ = os.RemoveAll(dir)
}

// sweep stops the servers left by test processes that are gone.
func sweep() {
	dirs, _ := filepath.Glob(filepath.Join(root, "run-*"))
	for _, d := range dirs {
		pidText, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), "run-"), "-")
		pid, err := strconv.Atoi(pidText)
		if err == nil && pid != os.Getpid() && syscall.Kill(pid, 0) == nil {
			continue // its process still runs: its servers are its own
		}
		stopDir(d)
	}
}

func (p *Pair) run(name string, args ...string) {
	p.t.Helper()
	out, err := asPostgres(name, args...).CombinedOutput()
	if err != nil {
		p.t.Fatalf("pgpair: %s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}

// asPostgres is a PostgreSQL binary run as the postgres OS user.
func asPostgres(name string, args ...string) *exec.Cmd {
	bin := filepath.Join(BinDir, name)
	if os.Geteuid() != 0 {
		return exec.Command(bin, args...)
	}
	return exec.Command("runuser", append([]string{"-u", "postgres", "--", bin}, args...)...)
}

func (p *Pair) appendFile(path, text string) {
	p.t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err == nil {
		_, err = f.WriteString(text)
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		p.t.Fatalf("pgpair: %v", err)
	}
}

func (p *Pair) exec(dsn, sql string) {
	p.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err == nil {
		_, err = conn.Exec(ctx, sql)
		_ = conn.Close(ctx)
	}
	if err != nil {
		p.t.Fatalf("pgpair: %s: %v", sql, err)
	}
}

func (p *Pair) queryString(dsn, sql string, args ...any) string {
	p.t.Helper()
	var s string
	if err := queryRow(dsn, sql, args, &s); err != nil {
		p.t.Fatalf("pgpair: %s: %v", sql, err)
	}
	return s
}

func queryRow(dsn, sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

func postgresUser() (uid, gid int, err error) {
	if os.Geteuid() != 0 {
		return os.Getuid(), os.Getgid(), nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return 0, 0, fmt.Errorf("pgpair: the servers run as the postgres user: %w", err)
	}
	uid, _ = strconv.Atoi(u.Uid)
	gid, _ = strconv.Atoi(u.Gid)
	return uid, gid, nil
}

// freePort is a TCP port of 127.0.0.1 that nothing listened on a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgpair: a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
