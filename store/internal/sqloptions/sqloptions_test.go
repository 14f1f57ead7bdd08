package sqloptions

import (
	"strings"
	"testing"
	"time"
)

// Zero settings take the defaults; each setting out of bounds is one error
// naming the Options type, the setting and the range to use.
func TestCheck(t *testing.T) {
	var keyLen, resultBytes, batch int
	var duty float64
	var timeout time.Duration
	s := Shared{MaxKeyLen: &keyLen, MaxResultBytes: &resultBytes, CleanupBatch: &batch, CleanupDuty: &duty, StatementTimeout: &timeout}
	l := Limits{MaxKeyLen: 1024, MaxResultBytes: 15 << 20}
	if errs := Check("x.Options", s, l); len(errs) != 0 {
		t.Fatalf("Check of zero settings = %v", errs)
	}
	if keyLen != DefaultMaxKeyLen || resultBytes != DefaultMaxResultBytes || batch != DefaultCleanupBatch ||
		duty != DefaultCleanupDuty || timeout != DefaultStatementTimeout {
		t.Fatalf("defaults = %d, %d, %d, %v, %v", keyLen, resultBytes, batch, duty, timeout)
	}
	keyLen, resultBytes, batch, duty, timeout = 1025, 16<<20, MaxCleanupBatch+1, 1.5, time.Microsecond
	errs := Check("x.Options", s, l)
	want := []string{"MaxKeyLen is 1025; use 1 to 1024 bytes", "MaxResultBytes is 16777216; use 1 to 15728640 bytes",
		"CleanupBatch is 100001; use 1 to 100000 rows", "CleanupDuty is 1.5; use a share above 0", "StatementTimeout is 1µs; use 1ms or more"}
	if len(errs) != len(want) {
		t.Fatalf("Check = %v, want %d errors", errs, len(want))
	}
	for i, err := range errs {
		if !strings.Contains(err.Error(), "x.Options") || !strings.Contains(err.Error(), want[i]) {
			t.Errorf("error %d = %q, want x.Options and %q", i, err, want[i])
		}
	}
}
