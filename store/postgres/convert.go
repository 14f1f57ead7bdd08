package postgres

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// partitionedMigration creates a new table of the partitioned layout, at
// partitionedVersion.
const (
	partitionedMigration = "migrations/partitioned/0003_partitioned.sql"
	partitionedVersion   = 3
)

// convertedColumns are the migrations after partitionedVersion that add
// columns to the records table, by version. Migrate applies them to a table
// of the DELETE layout before converting it, so the conversion gives the
// new partitioned table, of partitionedVersion's columns, those of them up
// to the old table's version too: ATTACH wants the old table's columns on
// the new one.
var convertedColumns = []struct {
	version int
	file    string
}{
	{9, "migrations/0009_retry_at.sql"},
}

// sqlClaimedAtDefault reads the default of claimed_at of a table of the
// DELETE layout whose conversion began: the conversion's time, less a
// microsecond.
const sqlClaimedAtDefault = `
SELECT (regexp_match(pg_get_expr(d.adbin, d.adrelid), '''([^'']*)'''))[1]::timestamptz
FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
WHERE a.attrelid = to_regclass($1) AND a.attname = 'claimed_at' AND NOT a.attisdropped`

// convertToPartitioned turns a table of the DELETE layout, at
// partitionedVersion, into the partitioned layout: the old table becomes the
// first partition, holding every claim before the conversion. The steps
// that read the table run online, and each is resumed by the next Migrate
// if one is interrupted: claimed_at is added with the conversion's time as
// a constant default (a change of the catalog, which also fixes that time
// for a resumed conversion), with the range as a CHECK constraint NOT VALID;
// the constraint is validated (SHARE UPDATE EXCLUSIVE: claims go on); the
// table's primary key (scope, key) is the unique index the partitioned
// layout wants of a partition, so no index is built. Workers
// of the DELETE layout keep working meanwhile. The last step
// (migrations/partitioned/convert.sql, then the attach) is one short
// transaction that reads no row; from then on those workers fail, saying to
// set the partitioned layout.
func (s *partitionedLayout) convertToPartitioned(ctx context.Context) error {
	oldName := s.opts.Table + "_delete_layout"
	rangeCheck := pgx.Identifier{s.opts.Table + "_claim_range"}.Sanitize()
	fail := func(step string, err error) error {
		return fmt.Errorf("oncemill: postgres: migrate: converting %s to the partitioned layout: %s: %w", s.names.table, step, err)
	}

	// 1. The column, and the range unchecked, under the migration lock.
	var bound time.Time
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", migrateLockKey); err != nil {
			return err
		}
		var def *time.Time
		if err := tx.QueryRow(ctx, sqlClaimedAtDefault, s.names.table).Scan(&def); err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		if def != nil { // a conversion began: resume it
			bound = def.Add(time.Microsecond)
			return nil
		}
		if err := tx.QueryRow(ctx, "SELECT now()").Scan(&bound); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s ADD COLUMN claimed_at timestamptz NOT NULL DEFAULT %s; ALTER TABLE %s ADD CONSTRAINT %s CHECK (claimed_at < %s) NOT VALID",
			s.names.table, timestampLiteral(bound.Add(-time.Microsecond)), s.names.table, rangeCheck, timestampLiteral(bound)), pgx.QueryExecModeSimpleProtocol)
		return err
	})
	if err != nil {
		return fail("adding claimed_at", err)
	}
	// 2. The range, checked without blocking claims.
	if _, err := s.pool.Exec(ctx, fmt.Sprintf("ALTER TABLE %s VALIDATE CONSTRAINT %s", s.names.table, rangeCheck)); err != nil {
		return fail("validating the range", err)
	}
	// 3. The switch, in one short transaction.
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return fail("beginning", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	var kind string
	if err := tx.QueryRow(ctx, "SELECT relkind::text FROM pg_class, pg_advisory_xact_lock($2) WHERE oid = to_regclass($1)", s.names.table, migrateLockKey).Scan(&kind); err != nil {
		return fail("taking the migration lock", err)
	}
	if kind == "p" {
		return nil // another worker finished it
	}
	r := strings.NewReplacer(
		"{{OLD_NAME}}", pgx.Identifier{oldName}.Sanitize(),
		"{{OLD}}", s.qualified(oldName),
		"{{BOUND}}", timestampLiteral(bound),
	)
	var version int // the old table's
	if err := tx.QueryRow(ctx, s.names.render(`SELECT coalesce(max(version), 0) FROM {{VERSIONS}}`)).Scan(&version); err != nil {
		return fail("reading the schema version", err)
	}
	files := []string{"migrations/partitioned/convert.sql", partitionedMigration}
	for _, c := range convertedColumns {
		if c.version <= version {
			files = append(files, c.file)
		}
	}
	for _, f := range files {
		b, err := migrationFS.ReadFile(f)
		if err != nil {
			return fmt.Errorf("oncemill: postgres: migrate: %w", err)
		}
		if _, err := tx.Exec(ctx, s.names.render(r.Replace(string(b))), pgx.QueryExecModeSimpleProtocol); err != nil {
			return fail(path.Base(f), err)
		}
	}
	attach := fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM (MINVALUE) TO (%s)", s.names.table, s.qualified(oldName), timestampLiteral(bound))
	if _, err := tx.Exec(ctx, attach); err != nil {
		return fail("attaching the old table", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fail("committing", err)
	}
	return nil
}
