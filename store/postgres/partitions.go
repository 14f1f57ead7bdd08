package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Partition upkeep of the partitioned layout (LayoutPartitioned): creating
// partitions ahead of the clock, and dropping those whose every row is past
// its purge time. docs/stores.md, "Partitioned layout (in progress)".

// dropLockTimeout bounds each lock a drop waits for: the partition's (held
// by a claim moving a row out of it, or a completion of one of its rows)
// and the parent's, which DROP takes ACCESS EXCLUSIVE and which every
// transaction on the table holds until it ends. Claims queue behind a drop
// that waits, so the bound is short; a drop that times out is tried again
// by the next pass. Below deadlock_timeout (1s by default), so that in a
// deadlock with a claim (which holds the parent and waits for the
// partition) the drop gives up first.
const dropLockTimeout = 500 * time.Millisecond

// partition is one partition of the table, [lower, upper) of claimed_at.
type partition struct {
	name         string
	lower, upper time.Time
}

// partitionName is the name of the partition starting at lower: the
// table's name, "_p" and lower in UTC to the minute, at most 48+2+12 = 62
// bytes (maxTableLen). Partitions of one table start at least a width
// apart, and widths are whole minutes (partitionWidth), so no two share a
// name, even when they do not start on a whole minute (after a conversion,
// the first starts where the converted table's range ends). A width of
// seconds (the benchmarks' WithPartitionWidth) names them to the second
// instead, with "_" alone: "_p" would make 48+2+14 = 64 bytes, past
// PostgreSQL's 63 (NAMEDATALEN-1), which it would cut without an error,
// and a digit where "p" stands keeps the two forms apart.
func (s *Store) partitionName(lower time.Time) string {
	if s.width%time.Minute != 0 {
		return s.opts.Table + "_" + lower.UTC().Format("20060102150405")
	}
	return s.opts.Table + "_p" + lower.UTC().Format("200601021504")
}

func (s *Store) qualified(name string) string {
	return pgx.Identifier{s.opts.Schema, name}.Sanitize()
}

// isNoPartition reports whether err is PostgreSQL's refusal of a row whose
// claimed_at no partition covers.
func isNoPartition(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "23514" && strings.HasPrefix(pgErr.Message, "no partition of relation")
}

// listPartitions reads the table's partitions from the catalog, oldest first.
func (s *Store) listPartitions(ctx context.Context, q querier) ([]partition, error) {
	rows, err := q.Query(ctx, s.sql.partitions, s.names.table)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(row pgx.CollectableRow) (partition, error) {
		var p partition
		err := row.Scan(&p.name, &p.lower, &p.upper)
		return p, err
	})
}

// partitionsAhead is how far past now the partitions reach after an
// upkeep: two passes of the cleaner, and at least two widths, so that the
// claims of a worker never wait for one (a claim that finds none creates
// it, ensurePartitions).
func (s *Store) partitionsAhead() time.Duration {
	return 2 * max(s.width, s.opts.CleanupInterval)
}

// ensurePartitions creates the partitions from now to partitionsAhead, in
// one transaction under an advisory lock of the table's, so that two
// workers never create the same one. A new partition starts where the
// newest ends, or at now rounded down to the width when there is none for
// now, so partitions never overlap, whatever width the workers before used.
// It fails naming the missing privilege when the role may not create them.
func (s *Store) ensurePartitions(ctx context.Context) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return wrap("creating partitions", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	var now time.Time
	if err := tx.QueryRow(ctx, "SELECT now() FROM pg_advisory_xact_lock($1)", s.partitionKey).Scan(&now); err != nil {
		return wrap("creating partitions", err)
	}
	parts, err := s.listPartitions(ctx, tx)
	if err != nil {
		return wrap("creating partitions: listing them", err)
	}
	lower := now.Truncate(s.width)
	if n := len(parts); n > 0 && parts[n-1].upper.After(lower) {
		lower = parts[n-1].upper
	}
	for end := now.Add(s.partitionsAhead()); lower.Before(end); lower = lower.Add(s.width) {
		name := s.partitionName(lower)
		// DDL takes no parameters; the bounds are timestamps this code formats.
		ddl := fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s') WITH (fillfactor = 80)",
			s.qualified(name), s.names.table, lower.UTC().Format(time.RFC3339Nano), lower.Add(s.width).UTC().Format(time.RFC3339Nano))
		if _, err := tx.Exec(ctx, ddl); err != nil {
			return s.partitionDDLError("creating partition "+name, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return wrap("creating partitions", err)
	}
	return nil
}

// partitionDDLError explains a refused CREATE or DROP of a partition.
func (s *Store) partitionDDLError(op string, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" { // insufficient_privilege
		return fmt.Errorf("oncemill: postgres: %s: %w (the partitioned layout creates and drops partitions as it runs: "+
			"the role needs CREATE on schema %s and must own table %s, or be a member of the role that owns it "+
			"(GRANT <owner role> TO <this role>; GRANT CREATE ON SCHEMA %s TO <this role>))",
			op, err, s.names.schema, s.names.table, s.names.schema)
	}
	return wrap(op, err)
}

// dropPartitions drops every partition whose range has ended and whose
// rows are all past their purge time and expired, and
// returns how many rows went with them. The background cleaner runs it
// under its one-leader lock.
//
// A partition is read twice: without a lock, which finds when its last row
// may go (remembered, so that a partition with a live row is not read
// again before then), and, once that time has come, under a SHARE lock,
// which waits for the transactions writing to it and keeps new writers out,
// so that what it reads is final. Only then is it dropped, in the same
// transaction. Readers (every claim's lookup) are not blocked until the
// DROP itself.
func (s *Store) dropPartitions(ctx context.Context) (int, error) {
	var now time.Time
	if err := s.pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
		return 0, wrap("dropping partitions", err)
	}
	parts, err := s.listPartitions(ctx, s.pool)
	if err != nil {
		return 0, wrap("dropping partitions: listing them", err)
	}
	removed := 0
	for _, p := range parts {
		if p.upper.After(now) {
			break // sorted: the rest are newer
		}
		if next, ok := s.partNext[p.name]; ok && next.After(now) {
			continue
		}
		var rows int
		var last *time.Time
		live := strings.ReplaceAll(sqlPartitionLive, "{{PART}}", s.qualified(p.name))
		if err := s.pool.QueryRow(ctx, live).Scan(&rows, &last); err != nil {
			return removed, wrap("dropping partitions: reading "+p.name, err)
		}
		if last != nil && last.After(now) {
			s.partNext[p.name] = *last
			continue
		}
		n, dropped, err := s.dropPartition(ctx, p)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable {
				continue // busy: the next pass tries again
			}
			return removed, err
		}
		if dropped {
			removed += n
			delete(s.partNext, p.name)
		}
	}
	return removed, nil
}

// dropPartition drops p if, under its SHARE lock, every row in it may go.
func (s *Store) dropPartition(ctx context.Context, p partition) (rows int, dropped bool, err error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return 0, false, wrap("dropping partition "+p.name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, fmt.Sprintf("SET LOCAL lock_timeout = %d", dropLockTimeout.Milliseconds())); err != nil {
		return 0, false, wrap("dropping partition "+p.name, err)
	}
	if _, err := tx.Exec(ctx, "LOCK TABLE "+s.qualified(p.name)+" IN SHARE MODE"); err != nil {
		return 0, false, err
	}
	var last *time.Time
	var now time.Time
	if err := tx.QueryRow(ctx, "SELECT count(*), max(greatest(purge_at, expires_at)), statement_timestamp() FROM "+s.qualified(p.name)).Scan(&rows, &last, &now); err != nil {
		return 0, false, wrap("dropping partition "+p.name, err)
	}
	if last != nil && last.After(now) {
		s.partNext[p.name] = *last
		return 0, false, nil
	}
	if _, err := tx.Exec(ctx, "DROP TABLE "+s.qualified(p.name)); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == lockNotAvailable {
			return 0, false, err
		}
		return 0, false, s.partitionDDLError("dropping partition "+p.name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, false, wrap("dropping partition "+p.name, err)
	}
	return rows, true, nil
}
