package tiered

import (
	"bytes"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
)

func TestRecordRoundTrip(t *testing.T) {
	k := id{scope: "s:1:x", key: "k\x00{}:"}
	now := time.Unix(1_700_000_000, 123456789)
	for _, rec := range []store.Record{
		{Status: store.StatusSucceeded, Token: 42, Attempt: 1, Fingerprint: "fp", Result: []byte("ok\x00\xff"),
			CreatedAt: now, UpdatedAt: now.Add(time.Second), ExpiresAt: now.Add(time.Hour), MessageUUID: "0191c1d2-uuid"},
		{Status: store.StatusSucceeded, Token: 1, Attempt: 3, Result: []byte{}},
		{Status: store.StatusSucceeded, Token: 1 << 62, Attempt: 1},
		{Status: store.StatusCachedFailure, Token: 7, Attempt: 2, ErrorKind: store.ErrorKindCached, ErrorMessage: "ünïcode, long " + string(bytes.Repeat([]byte("x"), 300))},
	} {
		got, ok := decodeRecord(k, encodeRecord(&rec))
		if !ok {
			t.Fatalf("decoding %+v failed", rec)
		}
		if got.Scope != k.scope || got.Key != k.key || got.Status != rec.Status || got.Token != rec.Token || got.Attempt != rec.Attempt ||
			got.Fingerprint != rec.Fingerprint || got.ErrorKind != rec.ErrorKind || got.ErrorMessage != rec.ErrorMessage || got.MessageUUID != rec.MessageUUID ||
			!bytes.Equal(got.Result, rec.Result) || (got.Result == nil) != (rec.Result == nil) ||
			!got.CreatedAt.Equal(rec.CreatedAt) || !got.UpdatedAt.Equal(rec.UpdatedAt) || !got.ExpiresAt.Equal(rec.ExpiresAt) {
			t.Errorf("round trip of %+v gave %+v", rec, got)
		}
	}
	// Tombstones, other layouts, unfinished records and truncated values
	// read as misses.
	full := encodeRecord(&store.Record{Status: store.StatusSucceeded, Token: 1, Attempt: 1, Fingerprint: "fp", Result: []byte("r")})
	bad := [][]byte{tombstone, nil, {kindRecord}, {kindRecord, layout + 1, byte(store.StatusSucceeded)}, full[:len(full)-3],
		encodeRecord(&store.Record{Status: store.StatusInProgress, Token: 1, Attempt: 1})}
	for _, v := range bad {
		if rec, ok := decodeRecord(k, v); ok {
			t.Errorf("decodeRecord(%q) = %+v, want a miss", v, rec)
		}
	}
}

func TestIDString(t *testing.T) {
	for _, k := range []id{{"", "k"}, {"a:b", "c"}, {"a", "b:c"}, {"1:x", ":"}, {"\x00", "\xff"}} {
		got, ok := parseID(idString(k))
		if !ok || got != k {
			t.Errorf("parseID(idString(%q)) = %q, %v", k, got, ok)
		}
	}
	if idString(id{"a:b", "c"}) == idString(id{"a", "b:c"}) {
		t.Error("two ids share a string")
	}
	for _, s := range []string{"", "x", "3:ab", "-1:a", "1:ab"} {
		if k, ok := parseID(s); ok {
			t.Errorf("parseID(%q) = %q, want failure", s, k)
		}
	}
}

// The offset bounds hold, keep the tightest sample, and widen with age.
func TestRemoteClock(t *testing.T) {
	var c remoteClock
	if _, ok := c.upper(0); ok {
		t.Fatal("a clock without samples has bounds")
	}
	// Remote is local + 1000. A sample read between local 0 and 100.
	c.observe(sampleOffset(1050, 0, 100))
	lo, _ := c.lower(100)
	hi, _ := c.upper(100)
	if lo != 950 || hi != 1050 {
		t.Fatalf("bounds = [%d, %d], want [950, 1050]", lo, hi)
	}
	// A tighter sample wins; a looser one does not.
	c.observe(sampleOffset(1210, 200, 210))
	c.observe(sampleOffset(1300, 0, 400))
	lo, _ = c.lower(210)
	hi, _ = c.upper(210)
	if lo != 1000 || hi != 1010 {
		t.Fatalf("bounds = [%d, %d], want [1000, 1010]", lo, hi)
	}
	// After a second of local time the bounds widen by the drift allowance.
	later := int64(210 + time.Second)
	lo, _ = c.lower(later)
	hi, _ = c.upper(later)
	if w := int64(time.Second) / driftDivisor; lo != 1000-w || hi != 1010+w {
		t.Fatalf("bounds after a second = [%d, %d], want widened by %d", lo, hi, w)
	}
	c.reset()
	if _, ok := c.lower(later); ok {
		t.Fatal("reset kept a sample")
	}
}

// The local tier drops an entry at its deadline; a fill that an
// invalidation overtook takes its entry out again, and nothing is filled
// before invalidations are heard.
func TestLocalTier(t *testing.T) {
	l, err := newLocalTier(10, 100)
	if err != nil {
		t.Fatal(err)
	}
	k := id{"s", "k"}
	l.add(k, &entry{rec: store.Record{Status: store.StatusSucceeded}, deadline: 100})
	if l.get(k, 99) == nil || l.get(k, 100) != nil || l.get(k, 0) != nil {
		t.Fatal("the entry is not served exactly until its deadline")
	}
	if l.fits(&store.Record{Result: make([]byte, 101)}) {
		t.Fatal("a record above LocalMaxRecordBytes fits")
	}
	for i := range 20 {
		l.add(id{"s", string(rune('a' + i))}, &entry{deadline: 1 << 62})
	}
	n := 0
	for i := range 20 {
		if l.get(id{"s", string(rune('a' + i))}, 0) != nil {
			n++
		}
	}
	if n > 10 {
		t.Fatalf("the tier holds %d entries, more than its capacity 10", n)
	}

	// A fill that read its record before an invalidation does not stay.
	s := &Store{local: l, opts: Options{MaxLocalAge: time.Hour}, base: time.Now()}
	l.remove(k)
	s.fillLocal(k, store.Record{Status: store.StatusSucceeded}, 1<<62, s.seq.Load())
	if l.get(k, s.now()) != nil {
		t.Fatal("a fill before the subscription to invalidations was confirmed stayed in the local tier")
	}
	s.subscribed.Store(true)
	seq := s.seq.Load()
	s.invalidateLocal(id{"s", "other"})
	s.fillLocal(k, store.Record{Status: store.StatusSucceeded}, 1<<62, seq)
	if l.get(k, s.now()) != nil {
		t.Fatal("a fill overtaken by an invalidation stayed in the local tier")
	}
	s.fillLocal(k, store.Record{Status: store.StatusSucceeded}, 1<<62, s.seq.Load())
	if d := l.get(k, s.now()); d == nil || d.deadline > s.now()+int64(time.Hour) {
		t.Fatal("a fill is not kept, or kept longer than MaxLocalAge")
	}

	var off *localTier // turned off
	off.add(k, &entry{deadline: 1 << 62})
	if off.get(k, 0) != nil || off.fits(&store.Record{}) {
		t.Fatal("a tier turned off holds something")
	}
}
