package postgres

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
	"github.com/jackc/pgx/v5"
)

// Key filters of the partitioned layout. A claim of a new key must find
// that the key has no row in any partition, and a lookup in a partitioned
// table reads the primary key of every partition: on a table larger than
// shared_buffers, a page read for each of the 25 or so partitions, which
// costs several times the claim's own insert. But a partition whose range
// has ended takes no new key: a row is inserted only into the partition of
// its claimed_at, the clock_timestamp() of the insert. So once a partition
// is closed, the cleaner's leader reads its keys once into a Bloom filter,
// stored in the table <Table>_key_filters; every worker loads the filters,
// and a claim (of either mode) or RecordRollback whose key none of them may
// hold looks it up only in the partitions that are still open (claimed_at >= the first unfiltered
// partition's lower bound, which PostgreSQL prunes to at execution). A key
// that a filter may hold (a row of it, or a false positive, 0.01% per
// filter) is looked up in every partition, as without filters.
// docs/stores.md, "Partitioned layout".

const (
	// keyFilterFalsePositives is the false-positive rate each filter is
	// sized for: 0.01%, about 2.4 bytes per key. With 24 filtered
	// partitions, 0.24% of new keys are looked up in every partition,
	// which costs several times a claim in one statement (0.1% made that
	// 2.4% of claims, and about a tenth of the claims' time on the server).
	keyFilterFalsePositives = 0.0001
	// keyFilterDelay is how long after a partition's range ends its filter
	// is built, at most (filterDelay): a row is inserted within
	// microseconds of reading the clock that chose its partition, and the
	// pass waits for every older transaction besides; the delay is for a
	// server clock set back, which would put new rows into a closed
	// partition.
	keyFilterDelay = time.Minute
)

// keyFilter is the filter of one closed partition.
type keyFilter struct {
	partition
	filter *bloom.BloomFilter
}

// keyFilters is what a claim consults: the filters of the oldest
// partitions, with no gap, and the lower bound of the first partition
// without one (open), from which on a new key is always looked up, with
// the claim statements for that bound.
type keyFilters struct {
	filters []keyFilter
	open    time.Time
	claims  partClaims
}

// partClaims are the partitioned layout's statements that look a key up,
// rendered for a lookup from one partition bound on (sql_partitioned.go).
type partClaims struct {
	lease, tx, new, deferred, rollback string
	// until, when set, is the upper bound of the one partition the claims
	// look a new key up in, which has a unique index on (scope, key):
	// while the clock is before it, newCurrent and deferredCurrent take a
	// new key in one statement (sqlPartClaimNewCurrent).
	until                       time.Time
	newCurrent, deferredCurrent string
}

// renderPartClaims renders the statements that look a key up for a lookup
// from the partition bound from on; the zero time means every partition.
// current is the partition that starts at from when it is keyed
// (partition.keyed), else the zero partition.
func renderPartClaims(n names, from time.Time, current partition) partClaims {
	bound := "'-infinity'::timestamptz"
	if !from.IsZero() {
		bound = timestampLiteral(from)
	}
	r := func(sql string) string { return n.render(strings.ReplaceAll(sql, "{{LOOKUP_FROM}}", bound)) }
	c := partClaims{
		lease:    r(strings.ReplaceAll(sqlPartClaim, "{{NEW_STATUS}}", "{{IN_PROGRESS}}")),
		tx:       r(strings.ReplaceAll(sqlPartClaim, "{{NEW_STATUS}}", "{{SUCCEEDED}}")),
		new:      r(newTokenFromSequence.Replace(sqlPartClaimNew)),
		deferred: r(deferredForm(sqlPartClaimNew)),
		rollback: r(sqlPartRecordRollback),
	}
	if current.name != "" {
		in := strings.NewReplacer("{{PARTITION}}", n.schema+"."+pgx.Identifier{current.name}.Sanitize(), "{{UNTIL}}", timestampLiteral(current.upper))
		c.until = current.upper
		c.newCurrent = r(newTokenFromSequence.Replace(in.Replace(sqlPartClaimNewCurrent)))
		c.deferredCurrent = r(deferredTokenLiteral.Replace(in.Replace(sqlPartClaimNewCurrentDeferred)))
	}
	return c
}

// inOneStatement reports whether a new key is taken in one statement
// (newCurrent, deferredCurrent) at now: in the partition of now, looked up
// nowhere else.
func (c *partClaims) inOneStatement(now time.Time) bool { return now.Before(c.until) }

// claimsFor is the claims for scope/key: those that look the key up from
// open when no filter may hold it, else everywhere's.
func (f *keyFilters) claimsFor(scope, key string, everywhere *partClaims) *partClaims {
	if f == nil {
		return everywhere
	}
	if len(f.filters) == 0 {
		return &f.claims // from the oldest partition on: everywhere
	}
	id := filterID(scope, key)
	k := f.filters[0].filter.K()
	locs := bloom.Locations(id, k)
	for _, kf := range f.filters {
		may := false
		if kf.filter.K() == k {
			may = kf.filter.TestLocations(locs)
		} else {
			may = kf.filter.Test(id)
		}
		if may {
			return everywhere
		}
	}
	return &f.claims
}

// filterID is what a filter holds of a key: scope, a NUL byte (which
// neither may contain), key.
func filterID(scope, key string) []byte {
	b := make([]byte, 0, len(scope)+1+len(key))
	b = append(b, scope...)
	b = append(b, 0)
	return append(b, key...)
}

// prefixFiltered returns the filters that cover parts (oldest first) from
// the oldest on without a gap, and the lower bound of the first partition
// with no filter; and that partition when it is keyed (for
// renderPartClaims), else the zero partition. With no partition at all,
// nothing is filtered.
func prefixFiltered(parts []partition, loaded map[string]keyFilter) (f *keyFilters, current partition) {
	f = &keyFilters{}
	for _, p := range parts {
		kf, ok := loaded[p.name]
		if !ok || !kf.lower.Equal(p.lower) || !kf.upper.Equal(p.upper) {
			f.open = p.lower
			if p.keyed {
				current = p
			}
			return f, current
		}
		f.filters = append(f.filters, kf)
	}
	// Every partition is filtered (none is open: the upkeep is behind); a
	// new partition would start at the newest's upper bound.
	if n := len(parts); n > 0 {
		f.open = parts[n-1].upper
	}
	return f, partition{}
}

// buildKeyFilters builds the filter of every partition of parts (those in
// the table, listed at now) closed for filterDelay that has none, and
// deletes the filters of partitions no longer in the table. The cleaner's
// leader runs it in partitionUpkeep.
//
// A partition's keys are read once every transaction older than the pass
// has ended (awaitOlderTransactions, which takes no lock): a transaction
// that put a row in the partition read the clock before its range ended,
// and so before the pass began, so the read sees every key the partition
// will ever hold. filterDelay guards against what the barrier cannot see:
// a server clock set back.
func (s *Store) buildKeyFilters(ctx context.Context, now time.Time, parts []partition) error {
	have, err := s.filterNames(ctx)
	if err != nil {
		return err
	}
	names := make(map[string]bool, len(parts))
	var due []partition
	for _, p := range parts {
		names[p.name] = true
		if !have[p.name] && !p.upper.Add(s.filterDelay()).After(now) {
			due = append(due, p)
		}
	}
	var stale []string
	for name := range have {
		if !names[name] {
			stale = append(stale, name)
		}
	}
	if len(stale) > 0 {
		if _, err := s.pool.Exec(ctx, "DELETE FROM "+s.names.keyFilters+" WHERE partition = ANY($1)", stale); err != nil {
			return wrap("deleting the key filters of dropped partitions", err)
		}
	}
	if len(due) == 0 {
		return nil
	}
	if ok, err := s.awaitOlderTransactions(ctx, now); !ok {
		return err // the next pass tries again
	}
	for _, p := range due {
		if err := s.buildKeyFilter(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// filterDelay is how long after a partition's range ends its filter may be
// built: keyFilterDelay, or a sixtieth of the width when that is shorter,
// so that a worker looks a new key up in two partitions, the one of now
// and the one before it, for the same share of the time at every width
// (about a sixtieth, and up to a cleaner interval more).
func (s *Store) filterDelay() time.Duration { return min(keyFilterDelay, s.width/60) }

// buildKeyFilter reads the keys of the closed partition p into a filter
// and stores it.
func (s *Store) buildKeyFilter(ctx context.Context, p partition) error {
	var n uint
	if err := s.pool.QueryRow(ctx, "SELECT count(*) FROM "+s.qualified(p.name)).Scan(&n); err != nil {
		return wrap("building the key filter of "+p.name, err)
	}
	f := bloom.NewWithEstimates(max(n, 1), keyFilterFalsePositives)
	rows, err := s.pool.Query(ctx, "SELECT scope, key FROM "+s.qualified(p.name))
	if err != nil {
		return wrap("building the key filter of "+p.name, err)
	}
	var scope, key string
	_, err = pgx.ForEachRow(rows, []any{&scope, &key}, func() error {
		f.Add(filterID(scope, key))
		return nil
	})
	if err != nil {
		return wrap("building the key filter of "+p.name, err)
	}
	b, err := f.MarshalBinary()
	if err != nil {
		return fmt.Errorf("oncemill: postgres: encoding the key filter of %s: %w", p.name, err)
	}
	_, err = s.pool.Exec(ctx, "INSERT INTO "+s.names.keyFilters+` (partition, lower_bound, upper_bound, keys, filter)
		VALUES ($1, $2, $3, $4, $5) ON CONFLICT (partition) DO NOTHING`, p.name, p.lower, p.upper, int64(n), b)
	if err != nil {
		return wrap("storing the key filter of "+p.name, err)
	}
	return nil
}

// filterNames lists the partitions that have a filter.
func (s *Store) filterNames(ctx context.Context) (map[string]bool, error) {
	rows, err := s.pool.Query(ctx, "SELECT partition FROM "+s.names.keyFilters)
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
// worker's cleaner runs it after its pass.
func (s *Store) refreshKeyFilters(ctx context.Context) error {
	_, parts, err := s.listPartitions(ctx, s.pool)
	if err != nil {
		return wrap("loading key filters: listing partitions", err)
	}
	parts = inTable(parts)
	have, err := s.filterNames(ctx)
	if err != nil {
		return err
	}
	old := map[string]keyFilter{}
	if cur := s.keyFilters.Load(); cur != nil {
		for _, kf := range cur.filters {
			old[kf.name] = kf
		}
	}
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
		kf := keyFilter{filter: &bloom.BloomFilter{}}
		err := s.pool.QueryRow(ctx, "SELECT partition, lower_bound, upper_bound, filter FROM "+s.names.keyFilters+" WHERE partition = $1", p.name).
			Scan(&kf.name, &kf.lower, &kf.upper, &b)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // dropped meanwhile
		}
		if err != nil {
			return wrap("loading the key filter of "+p.name, err)
		}
		if err := kf.filter.UnmarshalBinary(b); err != nil {
			return fmt.Errorf("oncemill: postgres: decoding the key filter of %s: %w", p.name, err)
		}
		loaded[p.name] = kf
	}
	f, current := prefixFiltered(parts, loaded)
	f.claims = renderPartClaims(s.names, f.open, current)
	s.keyFilters.Store(f)
	return nil
}
