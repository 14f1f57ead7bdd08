package postgres

import (
	"strings"
	"testing"
	"time"

	"github.com/bits-and-blooms/bloom/v3"
)

// Claims consult the filters of the oldest partitions up to the first one
// without a filter (or with one of other bounds): a key is looked up from
// that partition on.
func TestPrefixFiltered(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	part := func(i int) partition {
		return partition{name: "p" + string(rune('a'+i)), lower: t0.Add(time.Duration(i) * time.Hour), upper: t0.Add(time.Duration(i+1) * time.Hour)}
	}
	filtered := func(p partition) keyFilter { return keyFilter{partition: p, filter: bloom.NewWithEstimates(10, 0.001)} }
	parts := []partition{part(0), part(1), part(2), part(3)}
	shifted := part(1)
	shifted.upper = shifted.upper.Add(time.Minute)
	for _, tt := range []struct {
		name   string
		loaded map[string]keyFilter
		want   int
		open   time.Time
	}{
		{"none", nil, 0, parts[0].lower},
		{"prefix", map[string]keyFilter{"pa": filtered(part(0)), "pb": filtered(part(1))}, 2, parts[2].lower},
		{"gap", map[string]keyFilter{"pa": filtered(part(0)), "pc": filtered(part(2))}, 1, parts[1].lower},
		{"not the oldest", map[string]keyFilter{"pb": filtered(part(1))}, 0, parts[0].lower},
		{"other bounds", map[string]keyFilter{"pa": filtered(part(0)), "pb": filtered(shifted)}, 1, parts[1].lower},
		{"all", map[string]keyFilter{"pa": filtered(part(0)), "pb": filtered(part(1)), "pc": filtered(part(2)), "pd": filtered(part(3))}, 4, parts[3].upper},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := prefixFiltered(parts, tt.loaded)
			if len(f.filters) != tt.want || !f.open.Equal(tt.open) {
				t.Fatalf("%d filters, open %v; want %d, %v", len(f.filters), f.open, tt.want, tt.open)
			}
		})
	}
	if f := prefixFiltered(nil, nil); len(f.filters) != 0 || !f.open.IsZero() {
		t.Fatalf("no partition: %+v; want nothing filtered", f)
	}
}

// A key a filter holds is looked up everywhere; with no filter, every key is.
func TestClaimsFor(t *testing.T) {
	n := newNames("s", "t")
	everywhere := renderPartClaims(n, time.Time{})
	f := &keyFilters{filters: []keyFilter{{filter: bloom.NewWithEstimates(100, 0.001)}}, claims: renderPartClaims(n, time.Unix(0, 0))}
	f.filters[0].filter.Add(filterID("scope", "held"))
	if got := f.claimsFor("scope", "held", &everywhere); got != &everywhere {
		t.Fatal("a key the filter holds is not looked up everywhere")
	}
	if got := f.claimsFor("scope", "other", &everywhere); got != &f.claims {
		t.Fatal("a new key is looked up everywhere")
	}
	var none *keyFilters
	if got := none.claimsFor("scope", "other", &everywhere); got != &everywhere {
		t.Fatal("with no filters a key is not looked up everywhere")
	}
	for name, pair := range map[string][2]string{
		"lease": {everywhere.lease, f.claims.lease}, "tx": {everywhere.tx, f.claims.tx},
		"new": {everywhere.new, f.claims.new}, "rollback": {everywhere.rollback, f.claims.rollback},
	} {
		if pair[0] == pair[1] || strings.Contains(pair[1], "{{") {
			t.Fatalf("%s: the bound is not in the statement, or a placeholder is left", name)
		}
	}
}
