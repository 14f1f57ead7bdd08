package postgres_test

import (
	"context"
	"errors"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// proxied starts a toxiproxy proxy in process in front of the test
// database and returns it with a DSN that goes through it.
func proxied(t *testing.T) (*toxiproxy.Proxy, string) {
	t.Helper()
	u, err := url.Parse(testenv.PostgresDSN())
	if err != nil {
		t.Fatal(err)
	}
	upstream := u.Host
	if !strings.Contains(upstream, ":") {
		upstream = net.JoinHostPort(upstream, "5432")
	}
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(prometheus.NewRegistry()), zerolog.Nop())
	p := toxiproxy.NewProxy(srv, "postgres", "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		t.Fatalf("starting the proxy: %v", err)
	}
	t.Cleanup(p.Stop)
	u.Host = p.Listen
	return p, u.String()
}

// stall makes the proxy hold back everything the server sends, without
// closing any connection: a server or network that stops answering.
func stall(t *testing.T, p *toxiproxy.Proxy) {
	t.Helper()
	if _, err := p.Toxics.AddToxicJson(strings.NewReader(`{"name":"stall","type":"timeout","stream":"downstream","toxicity":1,"attributes":{"timeout":0}}`)); err != nil {
		t.Fatal(err)
	}
}

// A connection that stalls makes every store operation fail within its
// bound, on both layouts: Options.StatementTimeout, plus a claim's Wait,
// and for DeleteExpired on the partitioned layout twice the upkeep's wait
// (the longer of StatementTimeout and CleanupInterval); and Close return:
// nothing waits for the stall to end.
func TestStalledServerFailsOperationsWithinTheirBound(t *testing.T) {
	t.Parallel()
	for name, layout := range map[string]postgres.Layout{"delete": postgres.LayoutDelete, "partitioned": postgres.LayoutPartitioned} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			stalledServerFailsOperations(t, layout)
		})
	}
}

func stalledServerFailsOperations(t *testing.T, layout postgres.Layout) {
	direct := testenv.Pool(t)
	schema := testenv.Schema(t, direct)
	opts := postgres.Options{Schema: schema, Layout: layout}
	if layout == postgres.LayoutPartitioned {
		opts.Retention = partitionedRetention
	}
	newStore(t, direct, opts) // migrated

	p, through := proxied(t)
	cfg, err := pgxpool.ParseConfig(through)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	const bound, wait = 500 * time.Millisecond, 100 * time.Millisecond
	opts.StatementTimeout, opts.CleanupInterval = bound, -1 // the upkeep's wait: bound
	s, err := postgres.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background() // no deadline of the test's own: the bound must come from the store

	// Before the stall: a lease, and a one-transaction claim in flight.
	begun, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "leased", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	claimed, err := s.ClaimInTx(ctx, store.TxRequest{Key: "claimed", SuccessTTL: time.Hour, Wait: time.Second})
	if err != nil || claimed.Decision != store.DecisionExecute {
		t.Fatalf("Claim = %v, %v", claimed.Decision, err)
	}

	stall(t, p)
	deleteExpiredBound := bound
	if layout == postgres.LayoutPartitioned {
		deleteExpiredBound += 2 * bound
	}
	ops := []struct {
		name  string
		bound time.Duration
		run   func() error
	}{
		{"Commit", bound, func() error { return claimed.Tx.Commit(ctx, nil) }},
		{"ClaimLease", bound, func() error {
			_, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "new", LeaseDuration: time.Minute})
			return err
		}},
		{"Claim", bound + wait, func() error {
			_, err := s.ClaimInTx(ctx, store.TxRequest{Key: "new2", SuccessTTL: time.Hour, Wait: wait})
			return err
		}},
		{"Complete", bound, func() error {
			return s.Complete(ctx, begun.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour})
		}},
		{"Extend", bound, func() error { _, err := s.Extend(ctx, begun.Claim, time.Minute); return err }},
		{"Release", bound, func() error {
			return s.Release(ctx, begun.Claim, store.Completion{Status: store.StatusRetryable, TTL: time.Minute})
		}},
		{"RecordRollback", bound, func() error {
			return s.RecordRollback(ctx, claimed.Claim, "", store.Completion{Status: store.StatusRetryable, TTL: time.Hour})
		}},
		{"Get", bound, func() error { _, err := s.Get(ctx, "", "leased"); return err }},
		{"Delete", bound, func() error { return s.Delete(ctx, "", "other", 1) }},
		{"DeleteExpired", deleteExpiredBound, func() error { _, err := s.DeleteExpired(ctx, 10); return err }},
		{"CleanupLag", bound, func() error { _, err := s.CleanupLag(ctx); return err }},
	}
	// A liveness margin over each bound, for a loaded machine: what this
	// checks is that an operation ends near its bound, not at the stall's.
	const margin = 2 * time.Second
	for _, op := range ops {
		start := time.Now()
		err := op.run()
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s against a stalled server = %v, want an error wrapping context.DeadlineExceeded", op.name, err)
		}
		if took > op.bound+margin {
			t.Errorf("%s against a stalled server took %v, want its bound %v (and at most %v more)", op.name, took, op.bound, margin)
		}
	}
	closed := make(chan struct{})
	go func() {
		s.Close()
		close(closed)
	}()
	<-closed // the test binary's -timeout is the guard
}
