package postgres_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
)

// poolMeter measures what one pool's own connections cost, and nothing else
// running on the machine or the database:
//
//   - round trips: the write→read turns on the pool's connections (a
//     turnConn from the pool's DialFunc): a statement sent alone is one, a
//     batch or a pipeline sent in one go is one;
//   - commits: the transactions the pool's statements ended (its
//     statementCounter, the pool's tracer);
//   - server CPU: the CPU time of the pool's own backends, by the pids each
//     connection reported when it connected (pg_backend_pid(), in the pool's
//     AfterConnect), read from /proc/PID/stat (testenv.PidCPU): on this
//     machine only, and never another client's backend or the server's own
//     processes.
//
// A reading also holds this process's CPU time (testenv.ProcessCPU), which
// the pools share: a benchmark that runs one pool's rounds at a time reads
// it around each round for that round's client share.
type poolMeter struct {
	count statementCounter
	turns atomic.Int64
	mu    sync.Mutex
	pids  []int
}

// meteredPool is a pool of size connections (testenv.Pool) measured by the
// poolMeter returned. It never pings a connection on acquire: a variant's
// connections wait while the others' rounds run, and those pings are the
// benchmark's, not the variant's.
func meteredPool(tb testing.TB, size int) (*pgxpool.Pool, *poolMeter) {
	tb.Helper()
	m := &poolMeter{}
	pool := testenv.Pool(tb, func(cfg *pgxpool.Config) {
		cfg.MaxConns = int32(size)
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		cfg.ConnConfig.Tracer = &m.count
		dial := cfg.ConnConfig.DialFunc
		cfg.ConnConfig.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := dial(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			return &turnConn{Conn: c, turns: &m.turns}, nil
		}
		cfg.AfterConnect = func(ctx context.Context, c *pgx.Conn) error {
			var pid int
			if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
				return err
			}
			m.mu.Lock()
			m.pids = append(m.pids, pid)
			m.mu.Unlock()
			return nil
		}
	})
	return pool, m
}

// turnConn counts a turn each time a read follows a write: one a round trip,
// however many writes a batch or a TLS record split takes.
type turnConn struct {
	net.Conn
	turns *atomic.Int64
	wrote atomic.Bool
}

func (c *turnConn) Write(p []byte) (int, error) {
	c.wrote.Store(true)
	return c.Conn.Write(p)
}

func (c *turnConn) Read(p []byte) (int, error) {
	if c.wrote.Swap(false) {
		c.turns.Add(1)
	}
	return c.Conn.Read(p)
}

// meterReading is what a poolMeter read at one moment.
type meterReading struct {
	client time.Duration
	server map[int]time.Duration // by backend pid; a backend gone is left out
	turns  int64
	counts statementCounts
}

// read reads m: this process's CPU, each of the pool's backends', the
// turns and the counts.
func (m *poolMeter) read(tb testing.TB) meterReading {
	tb.Helper()
	r := meterReading{server: map[int]time.Duration{}, turns: m.turns.Load(), counts: m.count.load()}
	m.mu.Lock()
	pids := m.pids
	m.mu.Unlock()
	for _, pid := range pids {
		// A backend that has ended, or a pid that is not a postgres
		// process here (a server on another machine), is left out.
		if name, cpu, err := testenv.PidCPU(pid); err == nil && name == "postgres" {
			r.server[pid] = cpu
		}
	}
	var err error
	if r.client, err = testenv.ProcessCPU(); err != nil {
		tb.Fatal(err)
	}
	return r
}

// meterSpent adds up what a variant's rounds spent.
type meterSpent struct {
	client, server      time.Duration
	roundTrips, commits float64
	// serverRead says the backends' CPU was read: the server runs here.
	serverRead bool
}

// plus is s and what was spent from before to after: for the server, the
// time of each backend read at both ends, and all of one that connected
// in between.
func (s meterSpent) plus(before, after meterReading) meterSpent {
	s.client += after.client - before.client
	for pid, cpu := range after.server {
		s.server += cpu - before.server[pid]
		s.serverRead = true
	}
	s.roundTrips += float64(after.turns - before.turns)
	s.commits += after.counts.commits - before.counts.commits
	return s
}

// perMessage is s over n messages: client and server µs, round trips and
// commits.
func (s meterSpent) perMessage(n int) (client, server, roundTrips, commits float64) {
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 / float64(n) }
	return us(s.client), us(s.server), s.roundTrips / float64(n), s.commits / float64(n)
}

// String is s over n messages, for a log line.
func (s meterSpent) String(n int) string {
	client, server, rt, commits := s.perMessage(n)
	str := fmt.Sprintf("client %.1f µs", client)
	if s.serverRead {
		str += fmt.Sprintf(", server %.1f µs", server)
	}
	return str + fmt.Sprintf(", %.2f round trips, %.2f commits", rt, commits)
}

// TestPoolMeter: a metered pool counts its own round trips and commits, and
// reads its own backend's CPU: BEGIN, a statement and COMMIT are three
// round trips and a commit, a batch one round trip, once the connection has
// prepared the statements (the first pass, not counted).
func TestPoolMeter(t *testing.T) {
	pool, m := meteredPool(t, 1)
	ctx := t.Context()
	pass := func() {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, "SELECT count(*) FROM generate_series(1, $1::int)", 300000); err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		batch := &pgx.Batch{}
		batch.Queue("SELECT $1::int", 1)
		batch.Queue("SELECT $1::int + 1", 1)
		if err := pool.SendBatch(ctx, batch).Close(); err != nil {
			t.Fatal(err)
		}
	}
	pass()
	before := m.read(t)
	pass()
	after := m.read(t)
	s := meterSpent{}.plus(before, after)
	if s.roundTrips != 4 || s.commits != 2 {
		t.Errorf("counted %v round trips and %v commits, want 4 and 2", s.roundTrips, s.commits)
	}
	if len(after.server) != 1 || !s.serverRead {
		t.Errorf("read %d backends (%v), want the pool's one", len(after.server), after.server)
	}
	if s.client <= 0 || s.server < 0 {
		t.Errorf("spent client %v, server %v", s.client, s.server)
	}
}
