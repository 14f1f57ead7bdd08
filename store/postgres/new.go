package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/store/internal/cleanupmetrics"
	"github.com/oncemill/oncemill/store/internal/gate"
	"github.com/oncemill/oncemill/store/postgres/internal/claimtx"
)

// New returns a store over pool configured by opts. It does no I/O: call
// Migrate once (from any number of workers) before the first ClaimLease. The pool
// stays the caller's: Close does not close it.
//
// Size the pool for the handlers in flight: in the one-transaction mode each
// holds one connection for its transaction and needs no other; in the lease
// mode each takes one for a statement at a time. Add one for the cleaner.
func New(pool *pgxpool.Pool, opts Options) (*Store, error) {
	if pool == nil {
		return nil, configerr.New("pool", "nil; pass a *pgxpool.Pool from pgxpool.New")
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	n := newNames(opts.Schema, opts.Table)
	s := &Store{
		pool:         pool,
		opts:         opts,
		names:        n,
		sql:          newStatements(n, opts.AsyncBegin),
		gate:         gate.Gate{Store: "postgres", Timeout: opts.StatementTimeout},
		cleanupKey:   lockKey("cleanup", n),
		claimRetries: 10,
	}
	s.txc = claimtx.Config{Timeout: opts.StatementTimeout, MaxResultBytes: opts.MaxResultBytes, CommitResult: s.sql.commitResult}
	// The layout is chosen here, once. The partitioned layout's upkeep
	// runs at once: a worker that starts with no partition for now creates
	// it before its first claim needs it.
	upkeepAtStart := opts.Layout == LayoutPartitioned
	if upkeepAtStart {
		s.layout = newPartitioned(s)
	} else {
		s.layout = deleteLayout{s}
	}
	s.metrics, err = cleanupmetrics.Register(opts.MeterProvider, "github.com/oncemill/oncemill/store/postgres", opts.Schema+"."+opts.Table, s.CleanupLag, s.gate.Closed, opts.Logger)
	if err != nil {
		return nil, fmt.Errorf("oncemill: postgres: %w", err)
	}
	if opts.CleanupInterval > 0 {
		ctx, cancel := context.WithCancel(context.Background())
		s.stopCleaner = cancel
		s.cleanerDone = make(chan struct{})
		go s.cleaner(ctx, opts.CleanupInterval, upkeepAtStart)
	}
	return s, nil
}
