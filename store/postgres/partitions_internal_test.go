package postgres

import (
	"strings"
	"testing"
	"time"
)

// A partition is named by the table and its lower bound in UTC: to the
// minute for the widths partitionWidth gives (as before widths of seconds
// existed), to the second for a width of seconds; one name per partition
// whatever the width and the first bound, and never past PostgreSQL's 63
// bytes with the longest table name Options accepts.
func TestPartitionName(t *testing.T) {
	t.Parallel()
	paris := time.FixedZone("CET", 3600)
	at := time.Date(2026, 11, 26, 18, 24, 0, 0, paris) // 17:24 UTC
	for _, tt := range []struct {
		width time.Duration
		lower time.Time
		want  string
	}{
		{time.Hour, at, "t_p202611261724"},
		{time.Minute, at.Add(59 * time.Second), "t_p202611261724"},
		{5 * time.Second, at, "t_20261126172400"},
		{5 * time.Second, at.Add(35 * time.Second), "t_20261126172435"},
		{90 * time.Second, at.Add(30 * time.Second), "t_20261126172430"},
	} {
		s := &partitionedLayout{Store: &Store{opts: Options{Table: "t"}}, width: tt.width}
		if got := s.partitionName(tt.lower); got != tt.want {
			t.Errorf("width %v: partitionName(%v) = %q, want %q", tt.width, tt.lower, got, tt.want)
		}
	}

	long := strings.Repeat("a", maxTableLen)
	if _, err := (Options{Table: long}).withDefaults(); err != nil {
		t.Fatalf("a table name of maxTableLen (%d) is refused: %v", maxTableLen, err)
	}
	for _, width := range []time.Duration{time.Second, 5 * time.Second, 59 * time.Second, time.Minute, 2 * time.Minute, time.Hour, 24 * time.Hour} {
		s := &partitionedLayout{Store: &Store{opts: Options{Table: long}}, width: width}
		// Off the whole minute and second, as after a conversion.
		lower := at.Add(-time.Hour + 1234567*time.Microsecond)
		seen := map[string]time.Time{}
		for range 3000 {
			name := s.partitionName(lower)
			if len(name) > 63 {
				t.Fatalf("width %v: %q is %d bytes, past PostgreSQL's 63", width, name, len(name))
			}
			if prev, ok := seen[name]; ok {
				t.Fatalf("width %v: the partitions at %v and %v are both named %q", width, prev, lower, name)
			}
			seen[name] = lower
			lower = lower.Add(width)
		}
	}
}
