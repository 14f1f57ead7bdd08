package postgres

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/greatroar/blobloom"
	"github.com/jackc/pgx/v5"
)

// Key filters of the partitioned layout. A claim of a new key must find
// that the key has no row in any partition, and a lookup in a partitioned
// table reads the primary key of every partition: on a table larger than
// shared_buffers, a page read for each of the 25 or so partitions, which
// costs several times the claim's own insert. But a partition whose range
// has ended takes no new key: a row is inserted only into the partition of
// its claimed_at, the clock_timestamp() of the insert. So once a partition
// is closed, the cleaner's leader reads its keys once into a blocked Bloom
// filter (github.com/greatroar/blobloom), stored in the table
// <Table>_key_filters; every worker loads the filters,
// and a claim (of either mode) or RecordRollback whose key none of them may
// hold looks it up only in the partitions that are still open (claimed_at >= the first unfiltered
// partition's lower bound, which PostgreSQL prunes to at execution). A key
// that a filter may hold (a row of it, or a false positive, 0.01% per
// filter) is looked up in every partition, as without filters.

const (
	// keyFilterFalsePositives is the false-positive rate each filter is
	// sized for: 0.01%, about 3.1 bytes per key in a blocked filter. With
	// 24 filtered partitions, about 0.3% of new keys are looked up in every
	// partition (BenchmarkClaimsFor), which costs several times a claim in
	// one statement (0.1% made that 2.4% of claims, and about a tenth of
	// the claims' time on the server).
	keyFilterFalsePositives = 0.0001
	// keyFilterHash names, in every stored filter, the hash its keys are
	// added with (keyHash), so that a filter of another is refused.
	keyFilterHash = "oncemill xxhash64(scope NUL key)"
	// keyFilterDelay is how long after a partition's range ends its filter
	// is built, at most (filterDelay): a row is inserted within
	// microseconds of reading the clock that chose its partition, and the
	// pass waits for every older transaction besides; the delay is for a
	// server clock set back, which would put new rows into a closed
	// partition.
	keyFilterDelay = time.Minute
)

// deleteStaleKeyFilters deletes the filters of partitions no longer in the
// table (live: those in it), and their names from have. The cleaner's
// leader runs it in partitionUpkeep. A partition's filter is built by the
// read of it that retireClosed makes (readClosed).
func (s *partitionedLayout) deleteStaleKeyFilters(ctx context.Context, live []partition, have map[string]bool) error {
	names := make(map[string]bool, len(live))
	for _, p := range live {
		names[p.name] = true
	}
	var stale []string
	for name := range have {
		if !names[name] {
			stale = append(stale, name)
		}
	}
	if len(stale) == 0 {
		return nil
	}
	if _, err := s.pool.Exec(ctx, "DELETE FROM "+s.names.keyFilterTable+" WHERE partition = ANY($1)", stale); err != nil {
		return wrap("deleting the key filters of dropped partitions", err)
	}
	for _, name := range stale {
		delete(have, name)
	}
	return nil
}

// filterDelay is how long after a partition's range ends its filter may be
// built: keyFilterDelay, or a sixtieth of the width when that is shorter,
// so that a worker looks a new key up in two partitions, the one of now
// and the one before it, for the same share of the time at every width
// (about a sixtieth, and up to a cleaner interval more).
func (s *partitionedLayout) filterDelay() time.Duration { return min(keyFilterDelay, s.width/60) }

// storeKeyFilter stores f, the filter of the closed partition p's keys
// (readClosed).
func (s *partitionedLayout) storeKeyFilter(ctx context.Context, p partition, f *blobloom.Filter, keys int) error {
	var b bytes.Buffer
	if _, err := blobloom.Dump(&b, f, keyFilterHash); err != nil {
		return fmt.Errorf("oncemill: postgres: encoding the key filter of %s: %w", p.name, err)
	}
	_, err := s.pool.Exec(ctx, "INSERT INTO "+s.names.keyFilterTable+` (partition, lower_bound, upper_bound, keys, filter)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (partition) DO NOTHING`, p.name, p.lower, p.upper, int64(keys), b.Bytes())
	if err != nil {
		return wrap("storing the key filter of "+p.name, err)
	}
	return nil
}

// filterNames lists the partitions that have a filter.
func (s *partitionedLayout) filterNames(ctx context.Context) (map[string]bool, error) {
	return collectFilterNames(s.pool.Query(ctx, "SELECT partition FROM "+s.names.keyFilterTable))
}

// collectFilterNames reads the rows of filterNames's statement.
func collectFilterNames(rows pgx.Rows, err error) (map[string]bool, error) {
	if err != nil {
		return nil, wrap("listing key filters", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, wrap("listing key filters", err)
	}
	have := make(map[string]bool, len(names))
	for _, n := range names {
		have[n] = true
	}
	return have, nil
}

// refreshKeyFilters loads the filters this worker does not hold yet, drops
// those of dropped partitions, and publishes what claims consult. Every
// worker's cleaner that is not the leader runs it after its pass (the
// leader's upkeep loads them from what it read and did); a claim runs it
// when the partition it named is gone.
func (s *partitionedLayout) refreshKeyFilters(ctx context.Context) error {
	_, parts, err := s.listPartitions(ctx, s.pool)
	if err != nil {
		return wrap("loading key filters: listing partitions", err)
	}
	have, err := s.filterNames(ctx)
	if err != nil {
		return err
	}
	return s.loadKeyFilters(ctx, inTable(parts), have, nil)
}

// loadKeyFilters loads the filters of parts (in the table, oldest first)
// named in have that this worker holds neither already nor in built (the
// filters the leader's pass just built), drops the others, and publishes
// what claims consult.
func (s *partitionedLayout) loadKeyFilters(ctx context.Context, parts []partition, have map[string]bool, built map[string]keyFilter) error {
	old := map[string]keyFilter{}
	if cur := s.keyFilters.Load(); cur != nil {
		for _, kf := range cur.filters {
			old[kf.name] = kf
		}
	}
	maps.Copy(old, built)
	loaded := make(map[string]keyFilter, len(have))
	for _, p := range parts {
		if !have[p.name] {
			continue
		}
		if kf, ok := old[p.name]; ok {
			loaded[p.name] = kf
			continue
		}
		var b []byte
		var kf keyFilter
		err := s.pool.QueryRow(ctx, "SELECT partition, lower_bound, upper_bound, filter FROM "+s.names.keyFilterTable+" WHERE partition = $1", p.name).
			Scan(&kf.name, &kf.lower, &kf.upper, &b)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // dropped meanwhile
		}
		if err != nil {
			return wrap("loading the key filter of "+p.name, err)
		}
		if kf.filter, err = decodeKeyFilter(b); err != nil {
			return fmt.Errorf("oncemill: postgres: decoding the key filter of %s: %w", p.name, err)
		}
		loaded[p.name] = kf
	}
	f, current := prefixFiltered(parts, loaded)
	f.claims = renderPartClaims(s.names, f.open, current)
	s.keyFilters.Store(f)
	return nil
}

// decodeKeyFilter decodes a stored filter (storeKeyFilter), refusing one
// whose keys were added with another hash than keyHash.
func decodeKeyFilter(b []byte) (*blobloom.Filter, error) {
	l, err := blobloom.NewLoader(bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	if l.Comment != keyFilterHash {
		return nil, fmt.Errorf("the filter's keys were hashed with %q, not %q: drop the table's key filters, the cleaner's leader builds them again", l.Comment, keyFilterHash)
	}
	return l.Load(nil)
}
