package mysql

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"strings"
	"time"

	"github.com/oncemill/oncemill/store/internal/migrations"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// schemaVersion is the newest schema version Migrate applies.
var schemaVersion = len(migrations.Must(migrationFS, "mysql"))

// splitStatements splits a migration's SQL into its statements, each ending with
// a semicolon at the end of a line: the driver sends one at a time.
func splitStatements(text string) []string {
	var sts []string
	for _, st := range strings.SplitAfter(text, ";\n") {
		if st = strings.TrimSpace(stripComments(st)); st != "" {
			sts = append(sts, st)
		}
	}
	return sts
}

// stripComments drops the lines of s that are "--" comments.
func stripComments(s string) string {
	var b strings.Builder
	for line := range strings.Lines(s) {
		if !strings.HasPrefix(strings.TrimSpace(line), "--") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// migrateLockWait bounds the wait for another worker's Migrate.
const migrateLockWait = 60 // seconds

// Migrate creates or upgrades the records table and records each applied
// version in the table <Table>_migrations. It is idempotent and safe to run
// from many workers at once: they take turns under a named lock
// (GET_LOCK), and each applies what the others have not. MySQL commits
// each DDL statement by itself, so a Migrate cut short leaves the versions
// it finished recorded, and the next one goes on from there (every
// statement is written to run again).
func (s *Store) Migrate(ctx context.Context) error { return s.migrate(ctx, schemaVersion) }

func (s *Store) migrate(ctx context.Context, version int) error {
	ctx, cancel, err := s.gate.Enter(ctx, "migrate", migrateLockWait*time.Second)
	if err != nil {
		return err
	}
	defer s.gate.Leave(cancel)
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return wrap("migrate", err)
	}
	defer conn.Close()
	var server string
	if err := conn.QueryRowContext(ctx, "SELECT VERSION()").Scan(&server); err != nil {
		return wrap("migrate: reading the server's version", err)
	}
	if err := supportedServer(server); err != nil {
		return err
	}
	var locked sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(CONCAT('oncemill:migrate:', LEFT(SHA1(DATABASE()), 40)), ?)", migrateLockWait).Scan(&locked); err != nil {
		return wrap("migrate: taking the migration lock", err)
	}
	if !locked.Valid || locked.Int64 != 1 {
		return fmt.Errorf("oncemill: mysql: migrate: another worker held the migration lock for %d s; run Migrate again", migrateLockWait)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), "DO RELEASE_LOCK(CONCAT('oncemill:migrate:', LEFT(SHA1(DATABASE()), 40)))") //nolint:errcheck // the lock goes with the session anyway

	if _, err := conn.ExecContext(ctx, s.names.render(`CREATE TABLE IF NOT EXISTS {{VERSIONS}} (
	version    INT NOT NULL PRIMARY KEY,
	name       VARCHAR(255) NOT NULL,
	applied_at DATETIME(6) NOT NULL
) ENGINE=InnoDB`)); err != nil {
		return wrap("migrate: creating the version table", err)
	}
	var current int
	if err := conn.QueryRowContext(ctx, s.names.render(`SELECT COALESCE(MAX(version), 0) FROM {{VERSIONS}}`)).Scan(&current); err != nil {
		return wrap("migrate: reading the schema version", err)
	}
	if current > schemaVersion {
		return fmt.Errorf("oncemill: mysql: migrate: table %s is at schema version %d, newer than this build's %d; upgrade oncemill", s.names.table, current, schemaVersion)
	}
	for _, m := range migrations.Must(migrationFS, "mysql") {
		if m.Version <= current || m.Version > version {
			continue
		}
		for _, st := range splitStatements(m.SQL) {
			if _, err := conn.ExecContext(ctx, s.names.render(st)); err != nil {
				return wrap(fmt.Sprintf("migrate: applying version %d (%s)", m.Version, m.Name), err)
			}
		}
		if _, err := conn.ExecContext(ctx, s.names.render(`INSERT INTO {{VERSIONS}} (version, name, applied_at) VALUES (?, ?, UTC_TIMESTAMP(6))`), m.Version, m.Name); err != nil {
			return wrap(fmt.Sprintf("migrate: recording version %d", m.Version), err)
		}
	}
	return nil
}

// AppliedVersion is the newest schema version Migrate has applied to the
// store's table: 0 before the first Migrate.
func (s *Store) AppliedVersion(ctx context.Context) (int, error) {
	ctx, cancel, err := s.gate.Enter(ctx, "applied version", 0)
	if err != nil {
		return 0, err
	}
	defer s.gate.Leave(cancel)
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?`, s.names.versionsName).Scan(&n); err != nil {
		return 0, wrap("applied version", err)
	}
	if n == 0 {
		return 0, nil
	}
	var v int
	if err := s.db.QueryRowContext(ctx, s.names.render(`SELECT COALESCE(MAX(version), 0) FROM {{VERSIONS}}`)).Scan(&v); err != nil {
		return 0, wrap("applied version", err)
	}
	return v, nil
}

// supportedServer refuses a server whose statements this store does not
// speak: its lock-wait bound is MariaDB's SET STATEMENT (lockWait), which
// MySQL 8 rejects as a syntax error at the first duplicate's claim, so it
// is refused here, at Migrate, where a deployment starts.
func supportedServer(version string) error {
	if !strings.Contains(version, "MariaDB") {
		return fmt.Errorf("oncemill: mysql: migrate: the server is MySQL %s; this store runs on MariaDB (tested on 10.11) "+
			"(its lock-wait bound is MariaDB's SET STATEMENT)", version)
	}
	return nil
}
