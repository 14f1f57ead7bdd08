package postgres

import (
	"context"
	"embed"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/store/internal/migrations"
	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

//go:embed migrations/*.sql migrations/partitioned/*.sql
var migrationFS embed.FS

// schemaVersion is the newest schema version Migrate applies (AppliedVersion
// reports it after a Migrate).
var schemaVersion = len(migrations.Must(migrationFS, "postgres"))

// Migrate creates or upgrades the schema, the records table, its token
// sequence and cleanup index, and records each applied version in the table
// <Table>_migrations. It is idempotent, and safe to run from many workers at
// once: one transaction under pg_advisory_xact_lock applies what is missing,
// and the others then find nothing to do. In the partitioned layout it
// creates the partitioned table, or converts a table of the DELETE layout
// online (convertToPartitioned: its workers fail from the last step on, so
// switch them to the partitioned layout), and creates the partitions for
// now; in the DELETE layout it refuses a partitioned table.
func (s *Store) Migrate(ctx context.Context) error { return s.layout.migrate(ctx, schemaVersion) }

// AppliedVersion is the newest schema version Migrate has applied to the
// store's table: 0 before the first Migrate, the newest version this build
// knows after one of this build.
func (s *Store) AppliedVersion(ctx context.Context) (int, error) {
	ctx, cancel, err := s.gate.Enter(ctx, "applied version", 0)
	if err != nil {
		return 0, err
	}
	defer s.gate.Leave(cancel)
	var exists bool
	if err := s.pool.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", s.names.versions).Scan(&exists); err != nil {
		return 0, wrap("applied version", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := s.pool.QueryRow(ctx, s.names.render(`SELECT coalesce(max(version), 0) FROM {{VERSIONS}}`)).Scan(&v); err != nil {
		return 0, wrap("applied version", err)
	}
	return v, nil
}

// migrateTables applies the migrations up to version, in one transaction
// under the migration lock, and returns the kind of the table it found
// ('p' partitioned, 'r' plain, "" none). layout, called in the transaction
// with that kind and the table's version, refuses the table or creates it,
// and returns its version then.
func (s *Store) migrateTables(ctx context.Context, version int, layout func(tx pgx.Tx, kind string, current int) (int, error)) (string, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return "", fmt.Errorf("oncemill: postgres: migrate: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit

	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLockKey); err != nil {
		return "", fmt.Errorf("oncemill: postgres: migrate: taking the migration lock: %w", err)
	}
	// PostgreSQL checks CREATE on the database before IF NOT EXISTS, so the
	// schema is created only when it is missing: a role with USAGE and
	// CREATE on an existing schema migrates without rights on the database.
	var schemaExists bool
	if err := tx.QueryRow(ctx, "SELECT to_regnamespace($1) IS NOT NULL", s.names.schema).Scan(&schemaExists); err != nil {
		return "", fmt.Errorf("oncemill: postgres: migrate: looking up schema %s: %w", s.names.schema, err)
	}
	if !schemaExists {
		if _, err := tx.Exec(ctx, s.names.render(`CREATE SCHEMA IF NOT EXISTS {{SCHEMA}}`)); err != nil {
			return "", fmt.Errorf("oncemill: postgres: migrate: creating schema %s: %w%s", s.names.schema, err,
				grantHint(err, "(create the schema as its owner, or GRANT CREATE ON DATABASE <database> TO <this role>)"))
		}
	}
	setup := s.names.render(`CREATE TABLE IF NOT EXISTS {{VERSIONS}} (
	version    integer PRIMARY KEY,
	name       text NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`)
	if _, err := tx.Exec(ctx, setup); err != nil {
		return "", fmt.Errorf("oncemill: postgres: migrate: creating the version table in schema %s: %w%s", s.names.schema, err,
			grantHint(err, fmt.Sprintf("(GRANT USAGE, CREATE ON SCHEMA %s TO <this role>)", s.names.schema)))
	}
	var current int
	if err := tx.QueryRow(ctx, s.names.render(`SELECT coalesce(max(version), 0) FROM {{VERSIONS}}`)).Scan(&current); err != nil {
		return "", fmt.Errorf("oncemill: postgres: migrate: reading the schema version: %w", err)
	}
	if current > schemaVersion {
		return "", fmt.Errorf("oncemill: postgres: migrate: table %s is at schema version %d, newer than this build's %d; upgrade oncemill", s.names.table, current, schemaVersion)
	}
	var kind string // 'p' partitioned, 'r' plain, '' none
	if err := tx.QueryRow(ctx, "SELECT coalesce((SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)), '')", s.names.table).Scan(&kind); err != nil {
		return "", fmt.Errorf("oncemill: postgres: migrate: reading the table's kind: %w", err)
	}
	if current, err = layout(tx, kind, current); err != nil {
		return "", err
	}
	for _, m := range migrations.Must(migrationFS, "postgres") {
		if m.Version <= current || m.Version > version {
			continue
		}
		if _, err := tx.Exec(ctx, s.names.render(m.SQL), pgx.QueryExecModeSimpleProtocol); err != nil {
			return "", fmt.Errorf("oncemill: postgres: migrate: applying version %d (%s): %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, s.names.render(`INSERT INTO {{VERSIONS}} (version, name) VALUES ($1, $2)`), m.Version, m.Name); err != nil {
			return "", fmt.Errorf("oncemill: postgres: migrate: recording version %d: %w", m.Version, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return "", fmt.Errorf("oncemill: postgres: migrate: %w", err)
	}
	return kind, nil
}

// grantHint is " "+hint when err is PostgreSQL's refusal for a missing
// privilege, and "" otherwise.
func grantHint(err error, hint string) string {
	if pgerr.IsInsufficientPrivilege(err) {
		return " " + hint
	}
	return ""
}
