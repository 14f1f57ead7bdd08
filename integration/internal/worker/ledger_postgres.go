package worker

import (
	"context"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store/postgres"
)

// ledgerTable is the ledger's table, in the store's schema.
const ledgerTable = "oncemill_ledger"

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// postgresLedger books charges in a PostgreSQL table. With oncemill in the
// one-transaction mode (--store=postgres) the handler runs inside the
// transaction that claimed the "processed" record; the charge is written
// through postgres.TxFromContext into that same transaction, so the charge
// and the record commit together or not at all. Without a transaction (a
// handler run without oncemill, or --ledger=postgres beside a memory or
// Redis store) it writes through the pool.
//
// The table has no unique constraint on purpose: a second charge of a
// payment must show up as a second row, not be hidden by the database.
type postgresLedger struct {
	pool   *pgxpool.Pool
	schema string
	table  string // quoted schema.table
	// separate is true when the charge commits apart from oncemill's record
	// (the lease mode, --ledger=postgres): a charge on attempt 2 and later
	// books only if no earlier attempt booked the payment (see Charge).
	separate bool

	mu      sync.Mutex
	created atomic.Bool // the table exists
}

func newPostgresLedger(pool *pgxpool.Pool, schema string) (*postgresLedger, error) {
	if !schemaName.MatchString(schema) {
		return nil, fmt.Errorf("ledger: schema %q is not a plain lower-case SQL identifier", schema)
	}
	return &postgresLedger{pool: pool, schema: schema, table: pgx.Identifier{schema, ledgerTable}.Sanitize()}, nil
}

// create creates the schema and table unless they exist; once it has
// succeeded it does nothing.
func (l *postgresLedger) create(ctx context.Context) error {
	if l.created.Load() {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.created.Load() {
		return nil
	}
	ddl := fmt.Sprintf(`CREATE SCHEMA IF NOT EXISTS %s;
CREATE TABLE IF NOT EXISTS %s (
	id            bigserial PRIMARY KEY,
	scope         text        NOT NULL,
	payment_id    text        NOT NULL,
	message_uuid  text        NOT NULL,
	fencing_token bigint      NOT NULL,
	attempt       integer     NOT NULL,
	charged_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS %s ON %s (scope, payment_id);`,
		pgx.Identifier{l.schema}.Sanitize(), l.table,
		pgx.Identifier{ledgerTable + "_scope_payment"}.Sanitize(), l.table)
	// Several workers may start at once; serialize the DDL on an advisory lock.
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return fmt.Errorf("ledger: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, l.table); err != nil {
		return fmt.Errorf("ledger: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return fmt.Errorf("ledger: create %s: %w", l.table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("ledger: create %s: %w", l.table, err)
	}
	l.created.Store(true)
	return nil
}

// Charge books c. Beside a store whose record commits apart from the charge
// (separate), a redelivery after a crash between the charge and the record
// (a takeover), or after a cut that lost the reply of a committed insert (a
// retry), runs the handler again at attempt 2 or later: as
// docs/operations.md advises for an effect outside the record, that attempt
// looks for an earlier charge of the payment in the same statement that
// books, and books none if there is one. The first attempt, nearly every
// charge, pays nothing for the check.
func (l *postgresLedger) Charge(ctx context.Context, c Charge) error {
	args := []any{c.Scope, c.PaymentID, c.MessageUUID, c.Token, c.Attempt}
	if tx, ok := postgres.TxFromContext(ctx); ok {
		_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (scope, payment_id, message_uuid, fencing_token, attempt) VALUES ($1, $2, $3, $4, $5)`, l.table), args...)
		return err
	}
	if err := l.create(ctx); err != nil {
		return err
	}
	q := fmt.Sprintf(`INSERT INTO %s (scope, payment_id, message_uuid, fencing_token, attempt) VALUES ($1, $2, $3, $4, $5)`, l.table)
	if l.separate && c.Attempt > 1 {
		q = fmt.Sprintf(`INSERT INTO %[1]s (scope, payment_id, message_uuid, fencing_token, attempt)
SELECT $1, $2, $3, $4::bigint, $5::integer
WHERE NOT EXISTS (SELECT FROM %[1]s WHERE scope = $1 AND payment_id = $2)`, l.table)
	}
	_, err := l.pool.Exec(ctx, q, args...)
	return err
}

func (l *postgresLedger) Counts(ctx context.Context, scope string) (map[string]int, error) {
	if err := l.create(ctx); err != nil {
		return nil, err
	}
	rows, err := l.pool.Query(ctx, fmt.Sprintf(`SELECT payment_id, count(*) FROM %s WHERE scope = $1 GROUP BY payment_id`, l.table), scope)
	if err != nil {
		return nil, fmt.Errorf("ledger: count: %w", err)
	}
	out := map[string]int{}
	var id string
	var n int
	_, err = pgx.ForEachRow(rows, []any{&id, &n}, func() error {
		out[id] = n
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("ledger: count: %w", err)
	}
	return out, nil
}
