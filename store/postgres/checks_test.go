package postgres_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// checksOf names the CHECK constraints on status or attempt of the table
// tbl of schema and of its partitions.
func checksOf(t *testing.T, pool *pgxpool.Pool, schema, tbl string) []string {
	t.Helper()
	return texts(t, pool, `SELECT k.conrelid::regclass::text || '.' || k.conname
		FROM pg_constraint k
		WHERE k.contype = 'c'
			AND (k.conrelid = to_regclass($1) OR k.conrelid IN (SELECT inhrelid FROM pg_inherits WHERE inhparent = to_regclass($1)))
			AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = k.conrelid AND a.attnum = ANY (k.conkey) AND a.attname IN ('status', 'attempt'))`,
		table(schema, tbl))
}

// Migration 7 drops the CHECK constraints on status and attempt: from a
// table of the DELETE layout, from a partitioned table and every partition
// (those it inherited, and one a partition holds as its own), and from a
// DELETE-layout table converted while it still had them, whose old table
// becomes a partition. A store on the migrated table works as before.
func TestMigrationDropsTheChecks(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	ctx := t.Context()
	migrated := func(t *testing.T, s *postgres.Store, schema, tbl string) {
		t.Helper()
		if err := s.Migrate(ctx); err != nil {
			t.Fatal(err)
		}
		if got := checksOf(t, pool, schema, tbl); len(got) != 0 {
			t.Fatalf("CHECK constraints after Migrate: %v", got)
		}
		res, err := s.ClaimInTx(ctx, store.TxRequest{Scope: "s", Key: "after", SuccessTTL: time.Hour, Wait: time.Second})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("claim after the migration = %+v, %v", res.ClaimResult, err)
		}
		if err := res.Tx.Commit(ctx, nil); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("delete", func(t *testing.T) {
		schema := testenv.Schema(t, pool)
		s := newStoreAt(t, pool, postgres.Options{Schema: schema, CleanupInterval: -1}, 6)
		if got := checksOf(t, pool, schema, postgres.DefaultTable); len(got) != 2 {
			t.Fatalf("CHECK constraints at version 6: %v; want status's and attempt's", got)
		}
		migrated(t, s, schema, postgres.DefaultTable)
	})
	t.Run("partitioned", func(t *testing.T) {
		schema := testenv.Schema(t, pool)
		s := newStoreAt(t, pool, postgres.Options{Schema: schema, Table: partitionedTable, Layout: postgres.LayoutPartitioned, Retention: time.Hour, CleanupInterval: -1}, 6)
		// The table as versions 3 to 6 made it, with a partition that
		// holds the constraints as its own besides.
		qualified := table(schema, partitionedTable)
		run(t, pool, "ALTER TABLE "+qualified+" ADD CHECK (status BETWEEN 1 AND 4), ADD CHECK (attempt > 0)")
		run(t, pool, "ALTER TABLE "+pgx.Identifier{schema, partitionsOf(t, pool, schema)[0].name}.Sanitize()+" ADD CHECK (attempt > 0)")
		if got := checksOf(t, pool, schema, partitionedTable); len(got) < 2+2*len(partitionsOf(t, pool, schema)) {
			t.Fatalf("CHECK constraints before the migration: %v; want the table's and every partition's", got)
		}
		migrated(t, s, schema, partitionedTable)
	})
	t.Run("converted", func(t *testing.T) {
		schema := testenv.Schema(t, pool)
		opts := postgres.Options{Schema: schema, Table: partitionedTable, CleanupInterval: -1}
		newStoreAt(t, pool, opts, 5)
		opts.Layout, opts.Retention = postgres.LayoutPartitioned, time.Hour
		s := newStoreAt(t, pool, opts, 5) // converts, the old table's constraints with it
		if got := checksOf(t, pool, schema, partitionedTable); len(got) != 2 {
			t.Fatalf("CHECK constraints after the conversion at version 5: %v; want the old table's two", got)
		}
		migrated(t, s, schema, partitionedTable)
	})
}
