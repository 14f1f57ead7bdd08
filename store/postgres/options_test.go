package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	tests := []struct {
		name string
		opts postgres.Options
		want string // in the error; "" means valid
	}{
		{"zero value", postgres.Options{}, ""},
		{"custom names", postgres.Options{Schema: "billing", Table: "dedup_v2"}, ""},
		{"reserved word as table (quoted)", postgres.Options{Table: "select"}, ""},
		{"all limits at their bounds", postgres.Options{MaxKeyLen: 1024, MaxResultBytes: 64 << 20, CleanupBatch: 100000, StatementTimeout: time.Hour}, ""},
		{"cleanup off", postgres.Options{CleanupInterval: -1}, ""},

		{"injection in table", postgres.Options{Table: "x; drop table users"}, `Options: Table "x; drop table users" is not a plain identifier`},
		{"quote in table", postgres.Options{Table: `x"; DROP TABLE t; --`}, "Options: Table"},
		{"injection in schema", postgres.Options{Schema: "public; drop schema public cascade"}, "Options: Schema"},
		{"upper case", postgres.Options{Table: "Records"}, "lower-case"},
		{"leading digit", postgres.Options{Schema: "1abc"}, "Options: Schema"},
		{"dot in table", postgres.Options{Table: "public.records"}, "Options: Table"},
		{"space", postgres.Options{Table: "my records"}, "Options: Table"},
		{"unicode", postgres.Options{Table: "récords"}, "Options: Table"},
		{"schema too long", postgres.Options{Schema: strings.Repeat("s", 64)}, "Options: Schema"},
		{"table too long for derived names", postgres.Options{Table: strings.Repeat("t", 49)}, "at most 48"},
		{"system schema prefix", postgres.Options{Schema: "pg_oncemill"}, `starts with "pg_"`},
		{"negative MaxKeyLen", postgres.Options{MaxKeyLen: -1}, "Options: MaxKeyLen is -1"},
		{"MaxKeyLen above the index limit", postgres.Options{MaxKeyLen: 4096}, "Options: MaxKeyLen is 4096; use 1 to 1024"},
		{"negative MaxResultBytes", postgres.Options{MaxResultBytes: -1}, "Options: MaxResultBytes is -1"},
		{"huge MaxResultBytes", postgres.Options{MaxResultBytes: 1 << 30}, "Options: MaxResultBytes"},
		{"negative CleanupBatch", postgres.Options{CleanupBatch: -5}, "Options: CleanupBatch is -5"},
		{"huge CleanupBatch", postgres.Options{CleanupBatch: 1 << 20}, "Options: CleanupBatch"},
		{"StatementTimeout below a millisecond", postgres.Options{StatementTimeout: time.Microsecond}, "Options: StatementTimeout is 1µs"},
		{"own BEGIN", postgres.Options{TxOptions: pgx.TxOptions{BeginQuery: "BEGIN"}}, "BeginQuery or CommitQuery"},
		{"read-only transactions", postgres.Options{TxOptions: pgx.TxOptions{AccessMode: pgx.ReadOnly}}, "read only"},
		{"cleanup without rest", postgres.Options{CleanupDuty: 1}, ""},
		{"negative CleanupDuty", postgres.Options{CleanupDuty: -0.5}, "Options: CleanupDuty is -0.5"},
		{"CleanupDuty above 1", postgres.Options{CleanupDuty: 1.5}, "Options: CleanupDuty is 1.5"},
		{"CleanupDuty NaN", postgres.Options{CleanupDuty: math.NaN()}, "Options: CleanupDuty is NaN"},
		{"partitioned layout", postgres.Options{Layout: postgres.LayoutPartitioned, Retention: 7 * 24 * time.Hour}, ""},
		{"unknown layout", postgres.Options{Layout: 7}, "Options: Layout is 7"},
		{"negative Retention", postgres.Options{Retention: -time.Hour}, "Options: Retention is -1h0m0s"},
		{"partitioned at serializable", postgres.Options{Layout: postgres.LayoutPartitioned, TxOptions: pgx.TxOptions{IsoLevel: pgx.Serializable}}, "the partitioned layout claims a key at read committed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := postgres.New(pool, tt.opts)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("New accepted %+v", tt.opts)
			}
			if !errors.Is(err, oncemill.ErrInvalidConfig) {
				t.Errorf("error %v does not wrap oncemill.ErrInvalidConfig", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New error %q does not mention %q", err, tt.want)
			}
		})
	}

	t.Run("nil pool", func(t *testing.T) {
		t.Parallel()
		if _, err := postgres.New(nil, postgres.Options{}); err == nil || !strings.Contains(err.Error(), "pool: nil") {
			t.Fatalf("New(nil) = %v, want an error naming the pool", err)
		}
	})
	t.Run("every problem at once", func(t *testing.T) {
		t.Parallel()
		_, err := postgres.New(pool, postgres.Options{Table: "A", MaxKeyLen: -1, CleanupBatch: -1})
		for _, want := range []string{"Options: Table", "Options: MaxKeyLen", "Options: CleanupBatch"} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("error %v does not mention %s", err, want)
			}
		}
	})
}

// A hostile table name is refused by New, before anything reaches the
// database: the canary table survives, and no table of that name appears.
func TestHostileTableNameRefused(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	ctx := t.Context()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	canary := pgx.Identifier{schema, "canary"}.Sanitize()
	if _, err := pool.Exec(ctx, "CREATE TABLE "+canary+" (id int)"); err != nil {
		t.Fatal(err)
	}
	for _, hostile := range []string{
		"x; DROP TABLE " + schema + ".canary; --",
		`x" ; DROP TABLE "` + schema + `"."canary"; --`,
		"canary (id int); DROP TABLE " + schema + ".canary",
	} {
		s, err := postgres.New(pool, postgres.Options{Schema: schema, Table: hostile})
		if err == nil {
			s.Migrate(ctx) //nolint:errcheck // the test fails anyway
			s.Close()
			t.Fatalf("New accepted the table name %q", hostile)
		}
	}
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+canary).Scan(&n); err != nil {
		t.Fatalf("the canary table is gone: %v", err)
	}
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = $1", schema).Scan(&n); err != nil || n != 1 {
		t.Fatalf("schema %s holds %d tables (%v), want only the canary", schema, n, err)
	}
}

// Identifiers are quoted, so a reserved word works as the table name.
func TestReservedWordTable(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := newStore(t, pool, postgres.Options{Table: "select"})
	ctx := t.Context()
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease on table \"select\" = %v, %v", res.Decision, err)
	}
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
}

func TestMigrateConcurrentlyAndAgain(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool) // does not exist yet: Migrate creates it
	s, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	const workers = 8
	errs := make(chan error, workers)
	start := make(chan struct{})
	for range workers {
		go func() {
			<-start
			// Each worker has its own Store, as separate processes would.
			w, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1})
			if err == nil {
				err = w.Migrate(ctx)
				w.Close()
			}
			errs <- err
		}()
	}
	close(start)
	for range workers {
		if err := <-errs; err != nil {
			t.Fatalf("concurrent Migrate: %v", err)
		}
	}

	versions := func() (n int, applied time.Time) {
		t.Helper()
		q := fmt.Sprintf("SELECT count(*), max(applied_at) FROM %s", pgx.Identifier{schema, postgres.DefaultTable + "_migrations"}.Sanitize())
		if err := pool.QueryRow(ctx, q).Scan(&n, &applied); err != nil {
			t.Fatalf("reading versions: %v", err)
		}
		return n, applied
	}
	n, applied := versions()
	if n != postgres.SchemaVersion {
		t.Fatalf("%d version rows after 8 concurrent Migrates, want %d", n, postgres.SchemaVersion)
	}

	var oid uint32
	if err := pool.QueryRow(ctx, "SELECT $1::regclass::oid", schema+"."+postgres.DefaultTable).Scan(&oid); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	n2, applied2 := versions()
	var oid2 uint32
	if err := pool.QueryRow(ctx, "SELECT $1::regclass::oid", schema+"."+postgres.DefaultTable).Scan(&oid2); err != nil {
		t.Fatal(err)
	}
	if n2 != n || !applied2.Equal(applied) || oid2 != oid {
		t.Fatalf("Migrate again changed something: versions %d→%d, applied %v→%v, table oid %d→%d", n, n2, applied, applied2, oid, oid2)
	}

	// The table works.
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "k", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease after Migrate = %v, %v", res.Decision, err)
	}
}

func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema})
	ctx := t.Context()
	if _, err := pool.Exec(ctx, "INSERT INTO "+pgx.Identifier{schema, postgres.DefaultTable + "_migrations"}.Sanitize()+" (version, name) VALUES (999, 'future')"); err != nil {
		t.Fatal(err)
	}
	err := s.Migrate(ctx)
	if err == nil || !strings.Contains(err.Error(), "newer than this build") {
		t.Fatalf("Migrate over a newer schema = %v, want a refusal", err)
	}
}

func TestBeforeMigrateSaysSo(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.ClaimLease(t.Context(), store.LeaseRequest{Key: "k", LeaseDuration: time.Minute})
	if err == nil || !strings.Contains(err.Error(), "run Store.Migrate first") {
		t.Fatalf("ClaimLease before Migrate = %v, want a hint to migrate", err)
	}
}

// A table made by the first layout is moved to the current one in place:
// its records keep their outcome and stay readable, and a claim works on it.
func TestMigrateUpgradesTheFirstLayout(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStoreAt(t, pool, postgres.Options{Schema: schema}, 1)
	ctx := t.Context()
	_, err := pool.Exec(ctx, `INSERT INTO `+table(schema, "")+`
		(scope, key, status, token, attempt, lease_expires_at, result, created_at, updated_at, expires_at)
		VALUES ('s', 'old', 2, 1, 1, NULL, '\x01'::bytea, now(), now(), now() + interval '1 hour')`)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "s", "old")
	if err != nil || rec.Status != store.StatusSucceeded || string(rec.Result) != "\x01" {
		t.Fatalf("the old record after the upgrade = %+v, %v", rec, err)
	}
	res, err := s.ClaimInTx(ctx, store.TxRequest{Scope: "s", Key: "old", SuccessTTL: time.Hour, Wait: time.Second})
	if err != nil || res.Decision != store.DecisionReplay {
		t.Fatalf("claiming the old record = %v, %v; want a replay", res.Decision, err)
	}
	var version int
	if err := pool.QueryRow(ctx, "SELECT max(version) FROM "+table(schema, "oncemill_records_migrations")).Scan(&version); err != nil || version != postgres.SchemaVersion {
		t.Fatalf("schema version %d, %v; want %d", version, err, postgres.SchemaVersion)
	}
}

// A table of layout 2 gains the message_uuid column in place: its records
// read with an empty UUID, and a claim of one of them stores its claimer's
// (both the lease and the one-transaction paths).
func TestMigrateAddsTheMessageUUID(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStoreAt(t, pool, postgres.Options{Schema: schema}, 2)
	ctx := t.Context()
	// Before the upgrade, the error says what to run.
	if _, err := s.Get(ctx, "s", "k"); err == nil || !strings.Contains(err.Error(), "run Store.Migrate") {
		t.Fatalf("Get on a table of layout 2 = %v, want a hint to migrate", err)
	}
	for _, key := range []string{"lease", "tx"} {
		_, err := pool.Exec(ctx, `INSERT INTO `+table(schema, "")+`
			(scope, key, status, token, attempt, created_at, updated_at, expires_at, purge_at)
			VALUES ('s', $1, 4, 1, 1, now(), now(), now() + interval '1 hour', now() + interval '1 hour')`, key)
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := s.AppliedVersion(ctx); err != nil || v != postgres.SchemaVersion || v < 3 {
		t.Fatalf("AppliedVersion after the upgrade = %d, %v; want %d", v, err, postgres.SchemaVersion)
	}
	if rec, err := s.Get(ctx, "s", "lease"); err != nil || rec.Status != store.StatusRetryable || rec.MessageUUID != "" {
		t.Fatalf("the old record after the upgrade = %+v, %v; want retryable without a UUID", rec, err)
	}
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "lease", LeaseDuration: time.Minute, MessageUUID: "u-lease"})
	if err != nil || res.Decision != store.DecisionExecute || res.Claim.Attempt != 2 {
		t.Fatalf("claiming the old record = %+v, %v; want attempt 2", res, err)
	}
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	tx, err := s.ClaimInTx(ctx, store.TxRequest{Scope: "s", Key: "tx", SuccessTTL: time.Hour, Wait: time.Second, MessageUUID: "u-tx"})
	if err != nil || tx.Decision != store.DecisionExecute {
		t.Fatalf("claiming the old record in a transaction = %+v, %v", tx, err)
	}
	if err := tx.Tx.Commit(ctx, nil); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"lease": "u-lease", "tx": "u-tx"} {
		if rec, err := s.Get(ctx, "s", key); err != nil || rec.MessageUUID != want {
			t.Fatalf("Get(%q) = %+v, %v; want message UUID %q", key, rec, err, want)
		}
	}
}
