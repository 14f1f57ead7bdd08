package main

import (
	"testing"
	"time"
)

func TestAgeTakesDays(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{"7d", 7 * 24 * time.Hour},
		{"1d12h", 36 * time.Hour},
		{"0d30m", 30 * time.Minute},
		{"90m", 90 * time.Minute},
		{"24h", 24 * time.Hour},
	} {
		var a age
		if err := a.UnmarshalText([]byte(tc.in)); err != nil || time.Duration(a) != tc.want {
			t.Errorf("%q = %v, %v; want %v", tc.in, time.Duration(a), err, tc.want)
		}
	}
	for _, bad := range []string{"d", "1.5d", "-1d", "7days", "1w", ""} {
		var a age
		if err := a.UnmarshalText([]byte(bad)); err == nil {
			t.Errorf("%q = %v, want an error", bad, time.Duration(a))
		}
	}
}
