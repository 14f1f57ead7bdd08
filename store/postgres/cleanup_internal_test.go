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
