package postgres_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// Once migrated, the DELETE layout needs only rights on rows: a role with
// USAGE on the schema and the token sequence and SELECT, INSERT, UPDATE and
// DELETE on the table claims, completes, replays, claims in the handler's
// transaction and removes expired records (docs/postgres.md, Choosing a
// layout).
func TestDeleteLayoutNeedsOnlyRowPrivileges(t *testing.T) {
	t.Parallel()
	admin := testenv.Pool(t)
	schema := testenv.Schema(t, admin)
	newStore(t, admin, postgres.Options{Schema: schema})
	role, worker := newRole(t, admin, "_rows")
	run(t, admin, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), role))
	run(t, admin, fmt.Sprintf("GRANT SELECT, INSERT, UPDATE, DELETE ON %s TO %s", table(schema, ""), role))
	run(t, admin, fmt.Sprintf("GRANT USAGE ON %s TO %s", pgx.Identifier{schema, postgres.DefaultTable + "_token_seq"}.Sanitize(), role))
	s := storeAs(t, worker, schema)
	ctx := t.Context()

	lease := store.LeaseRequest{Scope: "s", Key: "lease", LeaseDuration: time.Minute}
	res, err := s.ClaimLease(ctx, lease)
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease = %v, %v; want execute", res.Decision, err)
	}
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if res, err := s.ClaimLease(ctx, lease); err != nil || res.Decision != store.DecisionReplay {
		t.Fatalf("ClaimLease of the finished key = %v, %v; want replay", res.Decision, err)
	}

	claim, err := s.ClaimInTx(ctx, store.TxRequest{Scope: "s", Key: "tx", SuccessTTL: time.Hour, Wait: time.Second})
	if err != nil || claim.Decision != store.DecisionExecute {
		t.Fatalf("ClaimInTx = %v, %v; want execute", claim.Decision, err)
	}
	if err := claim.Tx.Commit(ctx, nil); err != nil {
		t.Fatalf("Commit: %v", err)
	}

	advance(t, admin, table(schema, ""), 2*time.Hour)
	if n, err := s.DeleteExpired(ctx, 100); err != nil || n != 2 {
		t.Fatalf("DeleteExpired = %d, %v; want the 2 expired records removed", n, err)
	}
}

// Migrate needs USAGE and CREATE on an existing schema and nothing on the
// database; without them, its error names the grant to give.
func TestMigrateNeedsOnlyTheSchemasGrants(t *testing.T) {
	t.Parallel()
	admin := testenv.Pool(t)
	schema := testenv.Schema(t, admin)
	run(t, admin, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
	role, worker := newRole(t, admin, "_migrator")
	run(t, admin, fmt.Sprintf("GRANT USAGE ON SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), role))

	err := storeAs(t, worker, schema).Migrate(t.Context())
	if err == nil || !strings.Contains(err.Error(), "GRANT USAGE, CREATE ON SCHEMA") {
		t.Fatalf("Migrate with USAGE alone = %v; want an error naming the schema's grant", err)
	}
	err = storeAs(t, worker, schema+"_missing").Migrate(t.Context())
	if err == nil || !strings.Contains(err.Error(), "GRANT CREATE ON DATABASE") {
		t.Fatalf("Migrate into a missing schema without CREATE on the database = %v; want an error naming that grant", err)
	}

	run(t, admin, fmt.Sprintf("GRANT CREATE ON SCHEMA %s TO %s", pgx.Identifier{schema}.Sanitize(), role))
	s := storeAs(t, worker, schema)
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate with USAGE and CREATE on the schema: %v", err)
	}
	if err := s.Migrate(t.Context()); err != nil {
		t.Fatalf("Migrate again, the table current: %v", err)
	}
	if v, err := s.AppliedVersion(t.Context()); err != nil || v != postgres.SchemaVersion {
		t.Fatalf("AppliedVersion = %d, %v; want %d", v, err, postgres.SchemaVersion)
	}
}

// newRole creates a role with no rights, dropped with what it owns when the
// test ends, and a pool whose sessions act as it.
func newRole(t *testing.T, admin *pgxpool.Pool, suffix string) (string, *pgxpool.Pool) {
	t.Helper()
	role := pgx.Identifier{testenv.Schema(t, admin) + suffix}.Sanitize()
	run(t, admin, "CREATE ROLE "+role)
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), "DROP OWNED BY "+role)
		_, _ = admin.Exec(context.Background(), "DROP ROLE "+role)
	})
	return role, testenv.Pool(t, func(c *pgxpool.Config) {
		c.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
			_, err := conn.Exec(ctx, "SET ROLE "+role)
			return err
		}
	})
}

// storeAs is a store of the DELETE layout on schema over pool, its cleaner
// off.
func storeAs(t *testing.T, pool *pgxpool.Pool, schema string) *postgres.Store {
	t.Helper()
	s, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}
