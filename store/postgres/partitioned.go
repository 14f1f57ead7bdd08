package postgres

import (
	"strings"
	"sync/atomic"
	"time"

	"github.com/greatroar/blobloom"
	"github.com/jackc/pgx/v5"
)

// partitionedLayout is the layout of a table partitioned by claim time:
// its state here, its upkeep in partitions.go, keyfilters.go, closed.go
// and convert.go, and on top, in layout_partitioned.go, what the modes ask
// of it.
type partitionedLayout struct {
	*Store
	part partStatements
	// width is the partition width; partitionKey the advisory lock key of
	// partition creation.
	width        time.Duration
	partitionKey int64
	// partNext is when each partition read by the cleaner may be dropped
	// at the earliest, and its rows (guarded by cleanupMu: closed.go).
	partNext map[string]closedNext
	// keyFilters is what claims consult (keyfilters.go); nil until the
	// cleaner first loads the filters.
	keyFilters atomic.Pointer[keyFilters]
	// beginReadCommitted is set by the first one-transaction claim that
	// found its transaction at another level than read committed (the
	// server's default: sqlReadCommitted): from then on every claim's BEGIN
	// names read committed (txOptions).
	beginReadCommitted atomic.Bool
}

// partStatements are the layout's statements (sql_partitioned.go) with the
// store's names.
type partStatements struct {
	lockLease, lockTx, tryLock, lockDeferred string
	// everywhere are the claims that look a key up in every partition.
	everywhere partClaims
}

// partitionState is where a partition is in its way out.
type partitionState int

const (
	attached      partitionState = iota
	detachPending                // a DETACH … CONCURRENTLY was interrupted: FINALIZE completes it
	detached                     // detached by the upkeep but not dropped: only DROP is left
)

// partition is one partition of the table, [lower, upper) of claimed_at.
// A detached one has no bounds.
type partition struct {
	name         string
	lower, upper time.Time
	state        partitionState
	// keyed is whether a unique index on (scope, key) keeps a key to one
	// row in the partition (migration 6), which the claim of a new key in
	// one statement relies on (sqlPartClaimNewCurrent).
	keyed bool
}

// keyFilter is the filter of one closed partition. A blocked Bloom filter
// tests a key in one cache line: a claim tests every closed partition's
// filter, about 24, and with filters whose bits spread over the whole
// filter that was about 48 random reads of memory a claim, a cost the
// partitioned layout paid over the DELETE one.
type keyFilter struct {
	partition
	filter *blobloom.Filter
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
		lease:    r(strings.NewReplacer("{{NEW_STATUS}}", "{{IN_PROGRESS}}", "{{TAKEN}}", leaseTaken, "{{ANSWERED}}", leaseAnswered).Replace(sqlPartClaim)),
		tx:       r(strings.NewReplacer("{{NEW_STATUS}}", "{{SUCCEEDED}}", "{{TAKEN}}", "", "{{ANSWERED}}", "").Replace(sqlPartClaim)),
		new:      r(newTokenFromSequence.Replace(sqlPartClaimNew)),
		deferred: r(deferredForm(sqlPartClaimNew)),
		rollback: r(sqlPartRecordRollback),
	}
	if current.name != "" {
		in := strings.NewReplacer("{{PARTITION}}", n.schema+"."+pgx.Identifier{current.name}.Sanitize(), "{{UNTIL}}", timestampLiteral(current.upper))
		c.until = current.upper
		c.newCurrent = r(newTokenFromSequence.Replace(in.Replace(sqlPartClaimNewCurrent)))
		c.deferredCurrent = r(firstTokenLiteral.Replace(in.Replace(sqlPartClaimNewCurrentDeferred)))
	}
	return c
}

// inOneStatement reports whether a new key is taken in one statement
// (newCurrent, deferredCurrent) at now: in the partition of now, looked up
// nowhere else.
func (c *partClaims) inOneStatement(now time.Time) bool { return now.Before(c.until) }

// claimsFor is the claims for the key whose hash is h (keyHash): those
// that look the key up from open when no filter may hold it, else
// everywhere's.
func (f *keyFilters) claimsFor(h uint64, everywhere *partClaims) *partClaims {
	if f == nil {
		return everywhere
	}
	if len(f.filters) == 0 {
		return &f.claims // from the oldest partition on: everywhere
	}
	for _, kf := range f.filters {
		if kf.filter.Has(h) {
			return everywhere
		}
	}
	return &f.claims
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
