package postgres

import (
	"testing"
	"time"
)

// A pass rests between full batches so that it is busy for the CleanupDuty
// share of its time.
func TestCleanupPause(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		duty float64
		want time.Duration
	}{
		{1, 0},
		{0.5, 100 * time.Millisecond},
		{0.25, 300 * time.Millisecond},
		{0.8, 25 * time.Millisecond}, // within a microsecond: floating point
	} {
		s := &Store{opts: Options{CleanupDuty: tt.duty}}
		if got := s.cleanupPause(100 * time.Millisecond); (got - tt.want).Abs() > time.Microsecond {
			t.Errorf("duty %v: pause after a 100ms batch = %v, want %v", tt.duty, got, tt.want)
		}
	}
}

// A partition is a 24th of the retention in whole minutes, from a minute to
// a day.
func TestPartitionWidth(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ retention, want time.Duration }{
		{24 * time.Hour, time.Hour},
		{time.Hour, 2 * time.Minute}, // 2.5 minutes, in whole minutes
		{7 * 24 * time.Hour, 7 * time.Hour},
		{time.Second, time.Minute},
		{90 * 24 * time.Hour, 24 * time.Hour},
	} {
		if got := partitionWidth(tt.retention); got != tt.want {
			t.Errorf("partitionWidth(%v) = %v, want %v", tt.retention, got, tt.want)
		}
	}
}
