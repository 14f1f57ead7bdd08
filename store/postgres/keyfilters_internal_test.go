package postgres

import (
	"bytes"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/greatroar/blobloom"
)

// newKeyFilter is an empty filter for n keys.
func newKeyFilter(n uint64) *blobloom.Filter {
	return blobloom.NewOptimized(blobloom.Config{Capacity: n, FPRate: keyFilterFalsePositives})
}

// Claims consult the filters of the oldest partitions up to the first one
// without a filter (or with one of other bounds): a key is looked up from
// that partition on.
func TestPrefixFiltered(t *testing.T) {
	t0 := time.Date(2026, 11, 26, 0, 0, 0, 0, time.UTC)
	part := func(i int) partition {
		return partition{name: "p" + string(rune('a'+i)), lower: t0.Add(time.Duration(i) * time.Hour), upper: t0.Add(time.Duration(i+1) * time.Hour)}
	}
	filtered := func(p partition) keyFilter { return keyFilter{partition: p, filter: newKeyFilter(10)} }
	parts := []partition{part(0), part(1), part(2), part(3)}
	parts[2].keyed = true // only the third has its unique index (scope, key)
	shifted := part(1)
	shifted.upper = shifted.upper.Add(time.Minute)
	for _, tt := range []struct {
		name    string
		loaded  map[string]keyFilter
		want    int
		open    time.Time
		current string // the open partition when it is keyed
	}{
		{"none", nil, 0, parts[0].lower, ""},
		{"prefix", map[string]keyFilter{"pa": filtered(part(0)), "pb": filtered(part(1))}, 2, parts[2].lower, "pc"},
		{"gap", map[string]keyFilter{"pa": filtered(part(0)), "pc": filtered(part(2))}, 1, parts[1].lower, ""},
		{"not the oldest", map[string]keyFilter{"pb": filtered(part(1))}, 0, parts[0].lower, ""},
		{"other bounds", map[string]keyFilter{"pa": filtered(part(0)), "pb": filtered(shifted)}, 1, parts[1].lower, ""},
		{"all", map[string]keyFilter{"pa": filtered(part(0)), "pb": filtered(part(1)), "pc": filtered(part(2)), "pd": filtered(part(3))}, 4, parts[3].upper, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f, current := prefixFiltered(parts, tt.loaded)
			if len(f.filters) != tt.want || !f.open.Equal(tt.open) || current.name != tt.current {
				t.Fatalf("%d filters, open %v, current %q; want %d, %v, %q", len(f.filters), f.open, current.name, tt.want, tt.open, tt.current)
			}
		})
	}
	if f, current := prefixFiltered(nil, nil); len(f.filters) != 0 || !f.open.IsZero() || current.name != "" {
		t.Fatalf("no partition: %+v; want nothing filtered", f)
	}
}

// A key a filter holds is looked up everywhere; with no filters loaded,
// every key is; with none built, from the oldest partition on.
func TestClaimsFor(t *testing.T) {
	n := newNames("s", "t")
	everywhere := renderPartClaims(n, time.Time{}, partition{})
	open := partition{name: "t_p197001010000", lower: time.Unix(0, 0), upper: time.Unix(3600, 0), keyed: true}
	f := &keyFilters{filters: []keyFilter{{filter: newKeyFilter(100)}}, claims: renderPartClaims(n, open.lower, open)}
	f.filters[0].filter.Add(keyHash("scope", "held"))
	if got := f.claimsFor(keyHash("scope", "held"), &everywhere); got != &everywhere {
		t.Fatal("a key the filter holds is not looked up everywhere")
	}
	if got := f.claimsFor(keyHash("scope", "other"), &everywhere); got != &f.claims {
		t.Fatal("a new key is looked up everywhere")
	}
	var none *keyFilters
	if got := none.claimsFor(keyHash("scope", "other"), &everywhere); got != &everywhere {
		t.Fatal("with no filters loaded a key is not looked up everywhere")
	}
	unbuilt := &keyFilters{claims: renderPartClaims(n, time.Unix(0, 0), partition{})}
	if got := unbuilt.claimsFor(keyHash("scope", "held"), &everywhere); got != &unbuilt.claims {
		t.Fatal("with no filter built a key is not looked up from the oldest partition on")
	}
	for name, pair := range map[string][2]string{
		"lease": {everywhere.lease, f.claims.lease}, "tx": {everywhere.tx, f.claims.tx},
		"new": {everywhere.new, f.claims.new}, "rollback": {everywhere.rollback, f.claims.rollback},
		"new in one statement": {everywhere.newCurrent, f.claims.newCurrent}, "deferred in one statement": {everywhere.deferredCurrent, f.claims.deferredCurrent},
	} {
		if pair[0] == pair[1] || strings.Contains(pair[1], "{{") {
			t.Fatalf("%s: the bound is not in the statement, or a placeholder is left", name)
		}
	}
	// One statement for a new key only with a keyed open partition, and
	// only before its upper bound.
	if everywhere.inOneStatement(time.Unix(0, 0)) || unbuilt.claims.inOneStatement(time.Unix(0, 0)) {
		t.Fatal("one statement without a keyed open partition")
	}
	if !f.claims.inOneStatement(time.Unix(3599, 0)) || f.claims.inOneStatement(time.Unix(3600, 0)) {
		t.Fatal("one statement not exactly before the open partition's upper bound")
	}
	if !strings.Contains(f.claims.newCurrent, "'1970-01-01T01:00:00Z'::timestamptz") || !strings.Contains(f.claims.newCurrent, `INSERT INTO "s"."t_p197001010000"`) {
		t.Fatalf("the partition or its upper bound is not in the statement: %s", f.claims.newCurrent)
	}
}

// A partition's filter waits a sixtieth of the width after its range ends,
// a minute at most: at every width a worker looks a new key up in the
// partition before the one of now for the same share of the time.
func TestFilterDelay(t *testing.T) {
	for _, tt := range []struct{ width, want time.Duration }{
		{24 * time.Hour, time.Minute},
		{time.Hour, time.Minute},
		{10 * time.Minute, 10 * time.Second},
		{time.Minute, time.Second},
		{5 * time.Second, 5 * time.Second / 60},
	} {
		if got := (&partitionedLayout{width: tt.width}).filterDelay(); got != tt.want {
			t.Errorf("filterDelay at width %v = %v; want %v", tt.width, got, tt.want)
		}
	}
}

// A stored filter decodes to one that holds the same keys; one whose keys
// were added with another hash, or that is no blobloom dump (the encoding
// of an earlier schema version), is refused with the reason.
func TestDecodeKeyFilter(t *testing.T) {
	f := newKeyFilter(1000)
	for i := range 1000 {
		f.Add(keyHash("scope", strings.Repeat("k", i%7)+string(rune('a'+i%26))+string(rune(i))))
	}
	f.Add(keyHash("scope", "held"))
	dump := func(comment string) []byte {
		var b bytes.Buffer
		if _, err := blobloom.Dump(&b, f, comment); err != nil {
			t.Fatal(err)
		}
		return b.Bytes()
	}
	got, err := decodeKeyFilter(dump(keyFilterHash))
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equals(f) || !got.Has(keyHash("scope", "held")) {
		t.Fatal("the decoded filter is not the stored one")
	}
	if _, err := decodeKeyFilter(dump("fnv64(key)")); err == nil || !strings.Contains(err.Error(), `"fnv64(key)"`) {
		t.Fatalf("a filter of another hash: %v; want it refused, naming the hash", err)
	}
	if _, err := decodeKeyFilter([]byte("\x00\x00\x00\x00\x00\x00\x03\xe8not blobloom at all, and long enough for a header")); err == nil {
		t.Fatal("a filter in another encoding is not refused")
	}
}

// A filter sized for n keys takes about 3.1 bytes a key and, holding them,
// says "maybe" of about 0.01% of other keys (docs/postgres.md, "How it works").
func TestKeyFilterSize(t *testing.T) {
	const n = 100_000
	f := newKeyFilter(n)
	key := func(prefix string, i int) string { return prefix + string(rune('a'+i%26)) + strconv.Itoa(i) }
	for i := range n {
		f.Add(keyHash("scope", key("held-", i)))
	}
	if perKey := float64(f.NumBits()) / 8 / n; perKey < 3 || perKey > 3.3 {
		t.Fatalf("%.2f bytes a key; want about 3.1", perKey)
	}
	maybe := 0
	for i := range 10 * n {
		if f.Has(keyHash("scope", key("other-", i))) {
			maybe++
		}
	}
	if rate := float64(maybe) / (10 * n); rate > 2*keyFilterFalsePositives {
		t.Fatalf("%d of %d other keys may be held (%.4f%%); want about %.2f%%", maybe, 10*n, 100*rate, 100*keyFilterFalsePositives)
	}
}

// BenchmarkClaimsFor is the key filters' share of a claim of a new key:
// the test of one key against the filters of a retention of closed
// partitions (24 of 230,000 keys each, as BenchmarkPartitionedVersusInbox
// holds, about 17 MB), every key a new one.
//
//	go test -run='^$' -bench=ClaimsFor ./store/postgres
func BenchmarkClaimsFor(b *testing.B) {
	const filters, keys = 24, 230_000
	n := newNames("s", "t")
	everywhere := renderPartClaims(n, time.Time{}, partition{})
	f := &keyFilters{claims: renderPartClaims(n, time.Unix(0, 0), partition{})}
	for i := range filters {
		kf := keyFilter{filter: newKeyFilter(keys)}
		for j := range keys {
			kf.filter.Add(keyHash("bench", strconv.Itoa(i)+"/"+strconv.Itoa(j)))
		}
		f.filters = append(f.filters, kf)
	}
	newKeys := make([]string, 1<<16)
	for i := range newKeys {
		newKeys[i] = "new/" + strconv.Itoa(i)
	}
	b.ResetTimer()
	everywhereClaims := 0
	for i := range b.N {
		if f.claimsFor(keyHash("bench", newKeys[i&(len(newKeys)-1)]), &everywhere) == &everywhere {
			everywhereClaims++
		}
	}
	b.ReportMetric(float64(everywhereClaims)/float64(b.N), "everywhere/claim")
}
