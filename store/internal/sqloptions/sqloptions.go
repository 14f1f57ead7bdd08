// Package sqloptions checks and defaults the options the SQL stores
// (store/postgres, store/mysql) share, in one wording: each error names the
// setting and what to change it to.
package sqloptions

import (
	"time"

	"github.com/oncemill/oncemill/internal/configerr"
)

// Defaults and bounds the stores share.
const (
	DefaultMaxKeyLen        = 512
	DefaultMaxResultBytes   = 1 << 20
	DefaultCleanupBatch     = 500
	DefaultCleanupDuty      = 0.5
	DefaultStatementTimeout = 5 * time.Second
	MaxCleanupBatch         = 100_000
)

// Shared points at the shared settings of one store's Options.
type Shared struct {
	MaxKeyLen, MaxResultBytes, CleanupBatch *int
	CleanupDuty                             *float64
	StatementTimeout                        *time.Duration
}

// Limits are what one store's table and server hold.
type Limits struct {
	MaxKeyLen, MaxResultBytes int
}

// Check sets each zero setting of s to its default, and returns an error
// for each setting outside its bounds, as configerr errors of setting (the
// Options type: "mysql.Options").
func Check(setting string, s Shared, l Limits) []error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, configerr.New(setting, format, args...)) }
	switch {
	case *s.MaxKeyLen == 0:
		*s.MaxKeyLen = DefaultMaxKeyLen
	case *s.MaxKeyLen < 0 || *s.MaxKeyLen > l.MaxKeyLen:
		bad("MaxKeyLen is %d; use 1 to %d bytes, or 0 for the default %d (longer keys are hashed by the idempotency stage)", *s.MaxKeyLen, l.MaxKeyLen, DefaultMaxKeyLen)
	}
	switch {
	case *s.MaxResultBytes == 0:
		*s.MaxResultBytes = DefaultMaxResultBytes
	case *s.MaxResultBytes < 0 || *s.MaxResultBytes > l.MaxResultBytes:
		bad("MaxResultBytes is %d; use 1 to %d bytes, or 0 for the default %d", *s.MaxResultBytes, l.MaxResultBytes, DefaultMaxResultBytes)
	}
	switch {
	case *s.CleanupBatch == 0:
		*s.CleanupBatch = DefaultCleanupBatch
	case *s.CleanupBatch < 0 || *s.CleanupBatch > MaxCleanupBatch:
		bad("CleanupBatch is %d; use 1 to %d rows, or 0 for the default %d (small batches keep row locks short)", *s.CleanupBatch, MaxCleanupBatch, DefaultCleanupBatch)
	}
	switch {
	case *s.CleanupDuty == 0:
		*s.CleanupDuty = DefaultCleanupDuty
	case !(*s.CleanupDuty > 0 && *s.CleanupDuty <= 1):
		bad("CleanupDuty is %v; use a share above 0 and at most 1, or 0 for the default %v", *s.CleanupDuty, DefaultCleanupDuty)
	}
	switch {
	case *s.StatementTimeout == 0:
		*s.StatementTimeout = DefaultStatementTimeout
	case *s.StatementTimeout < time.Millisecond:
		bad("StatementTimeout is %v; use 1ms or more, or 0 for the default %v", *s.StatementTimeout, DefaultStatementTimeout)
	}
	return errs
}
