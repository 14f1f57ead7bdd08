package postgres

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// A coalesced statement runs again only after errors that certainly rolled
// it back as a whole.
func TestRetryableErrors(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{&pgconn.PgError{Code: "40P01"}, true},                            // deadlock_detected
		{fmt.Errorf("wrapped: %w", &pgconn.PgError{Code: "40001"}), true}, // serialization_failure
		{&pgconn.PgError{Code: "23505"}, false},                           // unique_violation
		{&pgconn.PgError{Code: "42P01"}, false},                           // undefined_table
		{errors.New("connection reset"), false},                           // may have been applied
	} {
		if got := retryable(tt.err); got != tt.want {
			t.Errorf("retryable(%v) = %v, want %v", tt.err, got, tt.want)
		}
	}
}
