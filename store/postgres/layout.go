package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/claimtx"
)

// The package in layers, each using only those below it: the modes on top
// (lease.go, tx.go with internal/claimtx, watermark.go with
// internal/watermark), which ask the layout (this interface) for what
// differs between the two: layout_delete.go, and layout_partitioned.go
// over the partitioned layout's files (partitioned.go, partitions.go,
// keyfilters.go, closed.go, convert.go); under them the shared pieces
// (postgres.go, claim.go, cleanup.go, migrate.go, sql.go, options.go and
// internal/gate, guardtx, lazytx, pgerr). New (new.go) wires them.

// layout is what the modes ask of the table's layout (Options.Layout),
// chosen once in New: deleteLayout or partitionedLayout. Its statements
// return PostgreSQL's errors as they are; the modes wrap them.
type layout interface {
	// claimLease runs the lease mode's claim once: decision 0 when the
	// statement left the key undecided.
	claimLease(ctx context.Context, req store.LeaseRequest) (store.ClaimResult, error)
	// claimTx begins conn's transaction and claims the key (hash h) in it,
	// waiting up to waitMS for another holder.
	claimTx(ctx context.Context, conn *pgxpool.Conn, req store.TxRequest, purge time.Duration, waitMS int64, h uint64) (store.ClaimResult, pgx.Tx, error)
	// deferredClaim is a deferred claim's statements, and its BEGIN's
	// options.
	deferredClaim(req *store.TxRequest, purge time.Duration, h uint64) (claimtx.Claim, pgx.TxOptions)
	// recordRollback writes the outcome of a rolled-back claim and
	// returns how many rows it wrote: 0 when another delivery claimed or
	// finished the key.
	recordRollback(ctx context.Context, lease store.Claim, fingerprint string, out store.Completion) (int64, error)
	// mend mends what err says the layout lacks (a partition for now, key
	// filters, an isolation level) and reports whether the operation
	// should run again; m is the operation's count of mends.
	mend(ctx context.Context, err error, m *mends) (again bool, _ error)

	// cleanupLag is Store.CleanupLag.
	cleanupLag(ctx context.Context) (time.Duration, error)
	// clean is one pass of the background cleaner. leader holds the
	// cleaner's one-leader lock; it is nil when another worker holds it.
	clean(ctx context.Context, leader *pgxpool.Conn) (int, error)
	// dropExpired is what DeleteExpired does before its DELETE: it
	// returns how many rows went, and the DELETE runs only if none did.
	dropExpired(ctx context.Context) (int, error)
	// migrate applies the migrations up to version (Store.Migrate).
	migrate(ctx context.Context, version int) error
}

// mends counts what mend did for one operation.
type mends struct {
	// inTx is set by a one-transaction claim, whose failures mend reads
	// more of.
	inTx bool
	// ensured counts the partitions created for now.
	ensured int
	// refreshed and namedReadCommitted are set once mend reloaded the key
	// filters, and made the claim's BEGIN name read committed.
	refreshed, namedReadCommitted bool
}
