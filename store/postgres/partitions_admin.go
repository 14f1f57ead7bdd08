package postgres

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// Partition is one partition of a table of the partitioned layout
// (Store.Partitions).
type Partition struct {
	Name string
	// From and To bound the claim times the partition holds, [From, To).
	// From is the zero time for the partition a converted table became,
	// which starts at MINVALUE.
	From, To time.Time
	// Rows is how many rows it holds, live or not yet dropped.
	Rows int64
}

// Partitions lists the partitions of the store's table, oldest first, with
// their row counts, whatever Options.Layout says: a table of the DELETE
// layout has none. It counts every partition's rows, one statement each,
// bounded by Options.StatementTimeout: an operator's call ("oncemill
// stats"), not one for a program in a loop.
func (s *Store) Partitions(ctx context.Context) ([]Partition, error) {
	lctx, cancel, err := s.gate.Enter(ctx, "partitions", 0)
	if err != nil {
		return nil, err
	}
	_, parts, err := s.listPartitions(lctx, s.pool)
	s.gate.Leave(cancel)
	if err != nil {
		return nil, wrap("partitions", err)
	}
	parts = inTable(parts)
	out := make([]Partition, 0, len(parts))
	for _, p := range parts {
		q := Partition{Name: p.name, To: p.upper}
		if p.lower.Year() > 1 { // MINVALUE reads as year 1
			q.From = p.lower
		}
		cctx, cancel, err := s.gate.Enter(ctx, "partitions", 0)
		if err != nil {
			return nil, err
		}
		err = s.pool.QueryRow(cctx, "SELECT count(*) FROM "+pgx.Identifier{s.opts.Schema, p.name}.Sanitize()).Scan(&q.Rows)
		s.gate.Leave(cancel)
		if err != nil {
			return nil, wrap("partitions: counting the rows of "+p.name, err)
		}
		out = append(out, q)
	}
	return out, nil
}
