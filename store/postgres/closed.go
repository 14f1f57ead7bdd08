package postgres

import (
	"context"
	"math"
	"strings"
	"time"

	"github.com/greatroar/blobloom"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// What the cleaner's leader does with the partitions whose range has
// ended: it reads each one once, after the pass's barrier, when its key
// filter is due (filterDelay after its range ends), for its keys and, from
// the same rows, the time its last row may go (partNext) and their count.
// From then on no write changes a row of it in place (every write of a
// row claimed filterDelay ago moves it: partFresh, partMove), so that time
// is final: the partition is dropped when it comes, without another read,
// at the cost of its DETACH and DROP. One whose rows may all go by the
// read is dropped then. partNext is in the leader's memory: a leader that
// does not hold it (after a restart, or a change of leader) reads the
// partition once more, without its keys, and goes by that read.

// closedRead is what one read of a closed partition found.
type closedRead struct {
	// last is when its last row may go (it is past its purge time and
	// expired, and aged: a write that takes it moves it out).
	last time.Time
	rows int
	// filter is the partition's key filter, when the read was for it.
	filter *blobloom.Filter
}

// closedNext is when a read partition may go (last) and how many rows the
// read found in it, which its drop reports: a row moved out since is
// counted among them, as dropPartition says.
type closedNext struct {
	last time.Time
	rows int
}

// closedStep is what a pass does with a closed partition.
type closedStep int

const (
	closedWait       closedStep = iota // nothing yet
	closedReadFilter                   // read it for its key filter
	closedReadDrop                     // read it for its drop time alone (partNext unknown)
	closedDrop                         // drop it, unread: partNext has come
)

// closedDue is what a pass at now does with the closed partition p (have:
// the partitions that have a key filter). Nothing before its filter is
// due (filterDelay after its range ends); then a read while it has none;
// once it has one, a drop when partNext has come, or a read when this
// leader does not know partNext.
func (s *partitionedLayout) closedDue(p partition, now time.Time, have map[string]bool) closedStep {
	next, known := s.partNext[p.name]
	switch {
	case p.upper.Add(s.filterDelay()).After(now):
		return closedWait
	case !have[p.name]:
		return closedReadFilter
	case !known:
		return closedReadDrop
	case next.last.After(now):
		return closedWait
	default:
		return closedDrop
	}
}

// retireClosed does, for every partition of parts (in the table, listed
// at now), what closedDue says: it reads those due for a read, after one
// barrier for them all, drops those whose rows may all go (by this read or
// an earlier one: dropPartition's steps 3 to 5), remembers for the others
// when they may (partNext), and builds and stores the key filters it read
// the keys of. It returns how many rows went with the partitions it
// dropped, their names, and the filters it built (for loadKeyFilters),
// which it adds to have.
func (s *partitionedLayout) retireClosed(ctx context.Context, now time.Time, parts []partition, have map[string]bool) (removed int, gone map[string]bool, built map[string]keyFilter, err error) {
	gone, built = map[string]bool{}, map[string]keyFilter{}
	type dueStep struct {
		partition
		step closedStep
	}
	var due []dueStep
	reads, listed := false, make(map[string]bool, len(parts))
	for _, p := range parts {
		listed[p.name] = true
		if step := s.closedDue(p, now, have); step != closedWait {
			due = append(due, dueStep{p, step})
			reads = reads || step != closedDrop
		}
	}
	for name := range s.partNext {
		if !listed[name] {
			delete(s.partNext, name) // dropped by another leader
		}
	}
	if reads { // a drop unread needs none (dropPartition, 3)
		if ok, err := s.awaitOlderTransactions(ctx, now); !ok {
			return 0, gone, built, err // the next pass tries again
		}
	}
	for _, d := range due {
		next := s.partNext[d.name]
		if d.step != closedDrop {
			r, err := s.readClosed(ctx, d.partition, d.step == closedReadFilter)
			if err != nil {
				return removed, gone, built, err
			}
			next = closedNext{last: r.last, rows: r.rows}
			if r.last.After(now) {
				s.partNext[d.name] = next
				if r.filter != nil {
					if err := s.storeKeyFilter(ctx, d.partition, r.filter, r.rows); err != nil {
						return removed, gone, built, err
					}
					have[d.name], built[d.name] = true, keyFilter{partition: d.partition, filter: r.filter}
				}
				continue
			}
		}
		n, err := s.dropPartition(ctx, d.partition, next.rows)
		if err != nil {
			return removed, gone, built, err
		}
		removed += n
		gone[d.name] = true
		delete(s.partNext, d.name)
		delete(have, d.name) // dropDetached deleted its filter
	}
	return removed, gone, built, nil
}

// partitionReadPages is how many pages of a closed partition one statement
// of its read covers (256 kB, about a thousand records). readClosed rests
// between them by Options.CleanupDuty, as the DELETE layout's cleanup rests
// between its batches, so that the read of a large partition (an hour's,
// millions of records) leaves the server to the claims for that share of
// the time instead of holding one of its cores for seconds.
const partitionReadPages = 32

// readClosed reads the closed partition p once: how many rows it holds and
// when the last may go, and with forFilter its keys into a key filter. It
// reads partitionReadPages at a time, resting between them (cleanupRest),
// in one REPEATABLE READ transaction, so that every chunk reads the same
// snapshot: a row that an update moves, between two chunks, from a page
// not read yet to one read already is read once, as it was. The snapshot
// is taken by the statement that reads the partition's size: a row
// version it sees was written before, in a page that existed then.
//
// The read comes after the pass's barrier (retireClosed), once every
// transaction older than the pass has ended: a transaction that put a row
// in the partition read the clock before its range ended, and so before
// the pass began, so the read sees every key the partition will ever hold,
// and every row as it stays until it goes (dropPartition, 2). filterDelay
// guards against what the barrier cannot see: a server clock set back.
// The keys' hashes are kept (8 bytes a key) until the filter is
// built, so that it is sized for the keys it holds without a count(*)
// first.
func (s *partitionedLayout) readClosed(ctx context.Context, p partition, forFilter bool) (closedRead, error) {
	r := closedRead{last: p.upper.Add(s.filterDelay())}
	fail := func(err error) (closedRead, error) {
		return closedRead{}, wrap("reading partition "+p.name, err)
	}
	tx, err := s.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // a no-op after Commit
	var pages int64
	if err := tx.QueryRow(ctx, sqlPartitionPages, s.qualified(p.name)).Scan(&pages); err != nil {
		return fail(err)
	}
	later := func(t time.Time) {
		if t.After(r.last) {
			r.last = t
		}
	}
	// chunk reads the pages [lo, hi).
	var chunk func(lo, hi pgtype.TID) error
	var hashes []uint64
	if forFilter {
		keys := strings.ReplaceAll(sqlPartitionKeys, "{{PART}}", s.qualified(p.name))
		var scope, key string
		var goes time.Time
		chunk = func(lo, hi pgtype.TID) error {
			rows, err := tx.Query(ctx, keys, lo, hi)
			if err != nil {
				return err
			}
			_, err = pgx.ForEachRow(rows, []any{&scope, &key, &goes}, func() error {
				hashes = append(hashes, keyHash(scope, key))
				later(goes)
				return nil
			})
			return err
		}
	} else {
		live := strings.ReplaceAll(sqlPartitionLive, "{{PART}}", s.qualified(p.name))
		chunk = func(lo, hi pgtype.TID) error {
			var last *time.Time
			var rows int
			if err := tx.QueryRow(ctx, live, lo, hi).Scan(&last, &rows); err != nil {
				return err
			}
			r.rows += rows
			if last != nil {
				later(*last)
			}
			return nil
		}
	}
	for from := int64(0); from < max(pages, 1); from += partitionReadPages {
		start := time.Now()
		lo := pgtype.TID{BlockNumber: uint32(from), Valid: true}
		hi := pgtype.TID{BlockNumber: uint32(from + partitionReadPages), Valid: true}
		rest := from+partitionReadPages < pages
		if !rest {
			hi = pgtype.TID{BlockNumber: math.MaxUint32, OffsetNumber: math.MaxUint16, Valid: true} // to the end
		}
		if err := chunk(lo, hi); err != nil {
			return fail(err)
		}
		if rest {
			s.cleanupRest(ctx, time.Since(start))
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(err)
	}
	if forFilter {
		r.rows = len(hashes)
		r.filter = blobloom.NewOptimized(blobloom.Config{Capacity: uint64(max(len(hashes), 1)), FPRate: keyFilterFalsePositives})
		for _, h := range hashes {
			r.filter.Add(h)
		}
	}
	return r, nil
}
