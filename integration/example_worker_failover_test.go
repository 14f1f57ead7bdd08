package integration

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/integration/internal/pgpair"
)

// TestExampleWorkerFailover runs cmd/example-worker's demo (--mode=run,
// gochannel, --store=postgres: the one-transaction mode) against a pair
// with a synchronous standby, through the multi-host connection string
// with target_session_attrs=read-write, and kills the primary and promotes
// the standby while it runs: the same process must reach the new primary
// and finish with every payment charged once (its exit code 0 and its
// summary say so).
func TestExampleWorkerFailover(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	build := exec.Command("go", "build", "-o", dir+string(filepath.Separator), "./example-worker")
	build.Dir = filepath.Join("..", "cmd")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building cmd/example-worker: %v\n%s", err, out)
	}
	p := pgpair.Start(t, pgpair.Options{Sync: true, Latency: failoverReplicationLatency})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	const count = 6000
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, filepath.Join(dir, "example-worker"), "--mode=run", "--store=postgres",
		"--postgres-dsn="+p.DSN(), "--count="+strconv.Itoa(count), "--partitions=4")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	must(t, cmd.Start())
	exited := make(chan error, 1)
	var exitedAt time.Time
	go func() { err := cmd.Wait(); exitedAt = time.Now(); exited <- err }()

	// The kill when a third of the payments are charged.
	pool, err := pgxpool.New(ctx, p.PrimaryDSN(pgpair.Database))
	must(t, err)
	charged := func() int {
		var n int
		if pool.QueryRow(ctx, "SELECT count(*) FROM public.oncemill_ledger").Scan(&n) != nil {
			return 0
		}
		return n
	}
	for charged() < count/3 {
		select {
		case err := <-exited:
			t.Fatalf("the demo ended (%v) before a third of its payments were charged; stdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
	}
	atKill := charged()
	pool.Close()
	kill := time.Now()
	lag := p.KillPrimary()
	time.Sleep(failoverPromoteAfter)
	p.Promote()
	promoted := time.Now()

	err = <-exited
	t.Logf("killed at %d ledger rows (replay lag %d bytes); the demo ended %v after the kill: %s",
		atKill, lag.ReplayBytes, time.Since(kill).Round(time.Millisecond), bytes.TrimSpace(stdout.Bytes()))
	if exitedAt.Before(promoted) {
		t.Fatalf("the demo ended (%v) before the promotion: the kill did not fall in its run; stdout:\n%s", err, stdout.String())
	}
	if err != nil {
		t.Fatalf("the demo failed across the failover: %v; stdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	m := regexp.MustCompile(`double_effects=(\d+) lost=(\d+)`).FindStringSubmatch(stdout.String())
	if m == nil || m[1] != "0" || m[2] != "0" {
		t.Errorf("summary %q: want double_effects=0 lost=0", m)
	}
}
