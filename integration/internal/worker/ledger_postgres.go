package worker

import (
	"context"
	"fmt"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/store/postgres"
)

// ledgerTable is the ledger's table, in the store's schema.
const ledgerTable = "oncemill_ledger"

var schemaName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// postgresLedger books charges in a table of the store's database. With
// oncemill in the one-transaction mode the handler runs inside the
// transaction that claimed the "processed" record; the charge is written
// through postgres.TxFromContext into that same transaction, so the charge
// and the record commit together or not at all. Without a transaction (a
// handler run without oncemill) it writes through the pool.
//
// The table has no unique constraint on purpose: a second charge of a
// payment must show up as a second row, not be hidden by the database.
type postgresLedger struct {
	pool  *pgxpool.Pool
	table string // quoted schema.table
}

func newPostgresLedger(ctx context.Context, pool *pgxpool.Pool, schema string) (*postgresLedger, error) {
	if !schemaName.MatchString(schema) {
		return nil, fmt.Errorf("ledger: schema %q is not a plain lower-case SQL identifier", schema)
	}
	l := &postgresLedger{pool: pool, table: pgx.Identifier{schema, ledgerTable}.Sanitize()}
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
		pgx.Identifier{schema}.Sanitize(), l.table,
		pgx.Identifier{ledgerTable + "_scope_payment"}.Sanitize(), l.table)
	// Several workers may start at once; serialize the DDL on an advisory lock.
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("ledger: begin: %w", err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, l.table); err != nil {
		return nil, fmt.Errorf("ledger: lock: %w", err)
	}
	if _, err := tx.Exec(ctx, ddl); err != nil {
		return nil, fmt.Errorf("ledger: create %s: %w", l.table, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("ledger: create %s: %w", l.table, err)
	}
	return l, nil
}

func (l *postgresLedger) Charge(ctx context.Context, c Charge) error {
	q := fmt.Sprintf(`INSERT INTO %s (scope, payment_id, message_uuid, fencing_token, attempt) VALUES ($1, $2, $3, $4, $5)`, l.table)
	args := []any{c.Scope, c.PaymentID, c.MessageUUID, c.Token, c.Attempt}
	if tx, ok := postgres.TxFromContext(ctx); ok {
		_, err := tx.Exec(ctx, q, args...)
		return err
	}
	_, err := l.pool.Exec(ctx, q, args...)
	return err
}

func (l *postgresLedger) Counts(ctx context.Context, scope string) (map[string]int, error) {
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
