package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/oncemill/oncemill/store/postgres/internal/pgerr"
)

// Partition upkeep of the partitioned layout: creating
// partitions ahead of the clock, and dropping those whose every row is past
// its purge time.

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
func (s *partitionedLayout) partitionName(lower time.Time) string {
	if s.width%time.Minute != 0 {
		return s.opts.Table + "_" + lower.UTC().Format("20060102150405")
	}
	return s.opts.Table + "_p" + lower.UTC().Format("200601021504")
}

func (s *Store) qualified(name string) string {
	return pgx.Identifier{s.opts.Schema, name}.Sanitize()
}

// listPartitions reads, in one statement, the database's now() and the
// table's partitions from the catalog, oldest first: those attached or
// detaching, then the tables the upkeep detached and has not dropped yet
// (found by detachedMarker).
func (s *Store) listPartitions(ctx context.Context, q querier) (time.Time, []partition, error) {
	return scanPartitions(q.Query(ctx, sqlPartitions, s.names.table, s.opts.Schema, s.detachedMarker()))
}

// listWithFilters is listPartitions and filterNames in one round trip: a
// pass of the cleaner's leader starts with both.
func (s *partitionedLayout) listWithFilters(ctx context.Context) (time.Time, []partition, map[string]bool, error) {
	b := &pgx.Batch{}
	b.Queue(sqlPartitions, s.names.table, s.opts.Schema, s.detachedMarker())
	b.Queue("SELECT partition FROM " + s.names.keyFilterTable)
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	now, parts, err := scanPartitions(br.Query())
	if err != nil {
		return time.Time{}, nil, nil, wrap("partition upkeep: listing partitions", err)
	}
	have, err := collectFilterNames(br.Query())
	return now, parts, have, err
}

// scanPartitions reads the rows of sqlPartitions.
func scanPartitions(rows pgx.Rows, err error) (time.Time, []partition, error) {
	if err != nil {
		return time.Time{}, nil, err
	}
	var now time.Time
	var parts []partition
	for rows.Next() {
		var name *string
		var p partition
		if err := rows.Scan(&now, &name, &p.lower, &p.upper, &p.state, &p.keyed); err != nil {
			rows.Close()
			return time.Time{}, nil, err
		}
		if name != nil { // nil: no partition, the row carries now() alone
			p.name = *name
			parts = append(parts, p)
		}
	}
	return now, parts, rows.Err()
}

// inTable is parts without those detached already.
func inTable(parts []partition) []partition {
	out := parts[:0:0]
	for _, p := range parts {
		if p.state != detached {
			out = append(out, p)
		}
	}
	return out
}

// detachedMarker is the comment the upkeep puts on a partition before it
// detaches it, by which a later pass finds and drops it if this one ends
// between the detach and the drop.
func (s *Store) detachedMarker() string {
	return "oncemill: detached from " + s.opts.Schema + "." + s.opts.Table + " by the partition upkeep; dropped by its next pass"
}

// partitionsAhead is how far past now the partitions reach after an
// upkeep: two passes of the cleaner, and at least two widths, so that the
// claims of a worker never wait for one (a claim that finds none creates
// it, ensurePartitions).
func (s *partitionedLayout) partitionsAhead() time.Duration {
	return 2 * max(s.width, s.opts.CleanupInterval)
}

// ensurePartitions creates the partitions from now to partitionsAhead, in
// one transaction under an advisory lock of the table's, so that two
// workers never create the same one, and returns now and the partitions
// (those it listed under the lock, and those it created), as
// listPartitions does. A new partition starts where the newest ends, or at
// now rounded down to the width when there is none for now, so partitions
// never overlap, whatever width the workers before used. It fails naming
// the missing privilege when the role may not create them.
func (s *partitionedLayout) ensurePartitions(ctx context.Context) (time.Time, []partition, error) {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return time.Time{}, nil, wrap("creating partitions", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	// The lock first, in a statement of its own: the list after it sees
	// every partition that the worker before created.
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", s.partitionKey); err != nil {
		return time.Time{}, nil, wrap("creating partitions", err)
	}
	now, parts, err := s.listPartitions(ctx, tx)
	if err != nil {
		return time.Time{}, nil, wrap("creating partitions: listing them", err)
	}
	attached := inTable(parts)
	lower := now.Truncate(s.width)
	if n := len(attached); n > 0 && attached[n-1].upper.After(lower) {
		lower = attached[n-1].upper
	}
	for end := now.Add(s.partitionsAhead()); lower.Before(end); lower = lower.Add(s.width) {
		name := s.partitionName(lower)
		// Created alone and then attached, not CREATE TABLE … PARTITION OF,
		// which locks the table ACCESS EXCLUSIVE: it would wait for every
		// transaction open on the table while every new claim queued
		// behind it. ATTACH takes SHARE UPDATE EXCLUSIVE, which no claim's
		// lock conflicts with, and the new table's scan finds it empty.
		// LIKE copies the columns with their types, collations, NOT NULL
		// and CHECK constraints, which ATTACH requires. The unique index
		// on (scope, key) is the partition's own (migration 6): the table
		// has none. DDL takes no parameters; the bounds are timestamps
		// this code formats.
		ddl := []string{
			fmt.Sprintf("CREATE TABLE %s (LIKE %s INCLUDING DEFAULTS INCLUDING CONSTRAINTS) WITH (fillfactor = 80)", s.qualified(name), s.names.table),
			fmt.Sprintf("CREATE UNIQUE INDEX ON %s (scope, key)", s.qualified(name)),
			fmt.Sprintf("ALTER TABLE %s ATTACH PARTITION %s FOR VALUES FROM ('%s') TO ('%s')",
				s.names.table, s.qualified(name), lower.UTC().Format(time.RFC3339Nano), lower.Add(s.width).UTC().Format(time.RFC3339Nano)),
		}
		for _, stmt := range ddl {
			if _, err := tx.Exec(ctx, stmt); err != nil {
				return time.Time{}, nil, s.partitionDDLError("creating partition "+name, err)
			}
		}
		parts = append(parts, partition{name: name, lower: lower, upper: lower.Add(s.width), keyed: true})
	}
	if err := tx.Commit(ctx); err != nil {
		return time.Time{}, nil, wrap("creating partitions", err)
	}
	return now, parts, nil
}

// partitionDDLError explains a refused CREATE or DROP of a partition.
func (s *partitionedLayout) partitionDDLError(op string, err error) error {
	if pgerr.IsInsufficientPrivilege(err) {
		return fmt.Errorf("oncemill: postgres: %s: %w (the partitioned layout creates and drops partitions as it runs: "+
			"the role needs CREATE on schema %s and must own table %s, or be a member of the role that owns it "+
			"(GRANT <owner role> TO <this role>; GRANT CREATE ON SCHEMA %s TO <this role>))",
			op, err, s.names.schema, s.names.table, s.names.schema)
	}
	return wrap(op, err)
}

// dropPartition drops the partition p, whose rows (rows of them, read after
// a pass's barrier: retireClosed) are all past their purge time and
// expired, without blocking a claim, and returns rows.
//
// A claim never waits for it: no lock it takes conflicts with the locks
// of claims (ROW EXCLUSIVE on the table and every partition). DROP TABLE of
// an attached partition would lock the table ACCESS EXCLUSIVE, which waits
// for every transaction open on it (a one-transaction handler's included)
// while every new claim queues behind it; instead a partition leaves the
// table by DETACH PARTITION … CONCURRENTLY, which takes SHARE UPDATE
// EXCLUSIVE on both, marks the partition detaching (statements that begin
// after that do not see it), waits, without holding a lock anyone waits
// for, for the transactions that may still see it, and then takes the
// partition alone ACCESS EXCLUSIVE; the detached table, which nothing
// reaches any more, is then dropped (locking only itself).
//
// Why no row that matters is lost. Let T be now, the database's now() read
// with the list. A partition is read when its range ended by T (upper <=
// T, and its filter's delay past: closedDue): a claim that begins at T or
// later puts its row, claimed_at being its statement_timestamp(), in a
// later partition. Then:
//
//  1. Barrier: wait (awaitOlderTransactions, polling pg_locks) until no
//     transaction that began before T holds a lock on the table or a
//     partition. Every statement of the store on a row takes those locks as
//     it starts, and holds them until its transaction ends.
//  2. Read the partition once (readClosed), when its key filter is due:
//     the time its last row may go, greatest(purge_at, expires_at), the
//     latest over its rows, and their count. Every write of a transaction
//     that began before T has committed or rolled back by now (1), so it is
//     in what this reads; one that began at T or later changes no row of
//     the partition in place: each is aged for its statement_timestamp()
//     (claimed filterDelay ago or more, every claimed_at being before the
//     bound), and a claim, RecordRollback, Complete, Release or Extend of an
//     aged row deletes it here and inserts it into the current partition
//     (sqlPartClaim, partMove). So that time is final: if it is after T,
//     the partition stays, and a pass at a later T past that time drops it
//     unread (partNext).
//  3. At a T past that time (the read's, or a later pass's), every row is
//     expired and past its purge time, and what a transaction that began
//     at T or later can do to one of them is: a claim or RecordRollback
//     that takes it moves it out; Complete and Release refuse it, as they
//     refuse any row past its purge time and expired (partLive: what the
//     DELETE layout's cleanup may have removed already); Extend refuses an
//     expired lease; a delete deletes. None of them can make a row of the
//     partition live again, so whatever the detach hides from a claim was
//     free to go. The later pass waits for no older transaction: a
//     statement that still sees the partition holds a lock the detach
//     waits for (4), and one that runs after the mark judges a row by its
//     transaction's now(), which for each statement of the store is its
//     own start or one round trip before it (a claim opens its
//     transaction), so it is past T as well.
//  4. DETACH … CONCURRENTLY. A claim that began before the partition was
//     marked detaching may still move a row out of it: the detach waits for
//     that claim's transaction, and the row it inserted into the current
//     partition is what the next claim of the key finds (after waiting for
//     the key's advisory lock). A claim that begins after the mark does not
//     see the partition: it finds no row where the rows were all free to
//     go, as after the DELETE layout's cleanup, and its token still rises
//     (one sequence). A Complete of one of its rows, in a transaction that
//     began at T or later, is refused (3), whether it sees the partition or
//     not: the lease was lost.
//  5. DROP TABLE of the detached table. Its rows are counted by the read
//     of 2, so that the drop reads nothing (a write that moved a row out
//     between the two leaves it counted among the dropped).
//
// No lock is taken before the read: the barrier, not a lock, makes it
// final.
func (s *partitionedLayout) dropPartition(ctx context.Context, p partition, rows int) (int, error) {
	// The mark first: if this pass ends after the detach, the next one
	// finds the table by it. Its commit need not wait for the WAL flush:
	// the detach's, after it, flushes it too, and before that the
	// partition is still attached.
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue("SET LOCAL synchronous_commit = off")
	b.Queue(fmt.Sprintf("COMMENT ON TABLE %s IS '%s'", s.qualified(p.name), s.detachedMarker()))
	b.Queue("commit")
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return 0, s.partitionDDLError("marking partition "+p.name, err)
	}
	if err := s.detach(ctx, p, "CONCURRENTLY"); err != nil {
		return 0, err
	}
	if err := s.dropDetached(ctx, p); err != nil {
		return 0, err
	}
	return rows, nil
}

// finishDrops completes what an earlier pass left half done: a detach that
// was interrupted (the partition detaching, found in the catalog) with
// DETACH … FINALIZE, and then the drop; a table detached but not dropped
// (marked by detachedMarker before the detach) with the drop. It returns
// how many rows went, counted before each drop, and the names of the tables
// it dropped.
func (s *partitionedLayout) finishDrops(ctx context.Context, parts []partition) (removed int, gone map[string]bool, err error) {
	gone = map[string]bool{}
	for _, p := range parts {
		switch p.state {
		case attached:
			continue
		case detachPending:
			if err := s.detach(ctx, p, "FINALIZE"); err != nil {
				return removed, gone, err
			}
		}
		// Nothing else reaches the table now, so this count is final.
		var n int
		if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.qualified(p.name)).Scan(&n); err != nil {
			return removed, gone, s.partitionDDLError("counting the rows of partition "+p.name, err)
		}
		if err := s.dropDetached(ctx, p); err != nil {
			return removed, gone, err
		}
		removed += n
		gone[p.name] = true
	}
	return removed, gone, nil
}

// without is parts but those named in gone.
func without(parts []partition, gone map[string]bool) []partition {
	var out []partition
	for _, p := range parts {
		if !gone[p.name] {
			out = append(out, p)
		}
	}
	return out
}

// detach runs DETACH PARTITION … mode (CONCURRENTLY or FINALIZE) of p,
// waiting up to upkeepWait: it blocks no claim, and one that is interrupted
// leaves p detaching, which the next pass finalizes.
func (s *partitionedLayout) detach(ctx context.Context, p partition, mode string) error {
	dctx, cancel := context.WithTimeout(ctx, s.upkeepWait())
	defer cancel()
	ddl := fmt.Sprintf("ALTER TABLE %s DETACH PARTITION %s %s", s.names.table, s.qualified(p.name), mode)
	if _, err := s.pool.Exec(dctx, ddl); err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "55000" && strings.Contains(pgErr.Message, "default partition") {
			return fmt.Errorf("oncemill: postgres: detaching partition %s: %w (the partitioned layout makes no DEFAULT partition, "+
				"and PostgreSQL cannot detach a partition concurrently while the table has one: detach the DEFAULT partition)", p.name, err)
		}
		return s.partitionDDLError("detaching partition "+p.name+" ("+mode+")", err)
	}
	return nil
}

// dropDetached drops the detached table p and its key filter, in one
// round trip. Nothing else reaches a detached table, so its lock is not
// waited for (a lock_timeout guards against a stray session). The commit
// does not wait for the WAL flush: a crash that loses it leaves the table
// marked (detachedMarker), and the next pass drops it (finishDrops).
func (s *partitionedLayout) dropDetached(ctx context.Context, p partition) error {
	b := &pgx.Batch{}
	b.Queue("begin")
	b.Queue(fmt.Sprintf("SET LOCAL lock_timeout = %d", s.opts.StatementTimeout.Milliseconds()))
	b.Queue("SET LOCAL synchronous_commit = off")
	b.Queue("DROP TABLE " + s.qualified(p.name))
	b.Queue("DELETE FROM "+s.names.keyFilterTable+" WHERE partition = $1", p.name)
	b.Queue("commit")
	if err := s.pool.SendBatch(ctx, b).Close(); err != nil {
		return s.partitionDDLError("dropping partition "+p.name, err)
	}
	return nil
}

// upkeepWait bounds each wait of the partition upkeep that blocks nobody:
// for the transactions older than a pass (awaitOlderTransactions) and for a
// DETACH … CONCURRENTLY or FINALIZE, which waits for the transactions that
// may still see the partition. The longer of Options.StatementTimeout and
// Options.CleanupInterval: a one-transaction handler may hold its
// transaction open longer than a statement, and a pass that runs out leaves
// the partition to the next one.
func (s *partitionedLayout) upkeepWait() time.Duration {
	return max(s.opts.StatementTimeout, s.opts.CleanupInterval)
}

// awaitOlderTransactions waits until no other transaction that began
// before t holds a lock on the table or one of its partitions, polling
// pg_locks: it takes no lock, so nobody waits for it. It reports false
// when upkeepWait ran out first (or ctx ended: then with its error).
// Autovacuum workers are not waited for: they write no row, and a detach
// cancels them.
func (s *partitionedLayout) awaitOlderTransactions(ctx context.Context, t time.Time) (bool, error) {
	wctx, cancel := context.WithTimeout(ctx, s.upkeepWait())
	defer cancel()
	pause := 10 * time.Millisecond
	for {
		var older bool
		err := s.pool.QueryRow(wctx, sqlOlderLockers, s.names.table, t).Scan(&older)
		if err != nil {
			if wctx.Err() != nil && ctx.Err() == nil {
				return false, nil
			}
			return false, wrap("partition upkeep: waiting for older transactions", err)
		}
		if !older {
			return true, nil
		}
		timer := time.NewTimer(pause)
		select {
		case <-wctx.Done():
			timer.Stop()
			if ctx.Err() != nil {
				return false, fmt.Errorf("oncemill: postgres: partition upkeep: %w", ctx.Err())
			}
			return false, nil
		case <-timer.C:
		}
		pause = min(2*pause, 200*time.Millisecond)
	}
}
