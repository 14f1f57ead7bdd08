package keygen_test

import (
	"errors"
	"testing"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/keygen"
)

func TestSentinelsWrapErrNoKey(t *testing.T) {
	t.Parallel()
	for _, err := range []error{keygen.ErrMissingMetadata, keygen.ErrNotJSON, keygen.ErrEmptyKey} {
		if !errors.Is(err, keygen.ErrNoKey) {
			t.Errorf("errors.Is(%v, ErrNoKey) = false", err)
		}
	}
	// Bad options are a programming error, not a message without a key.
	if errors.Is(oncemill.ErrInvalidConfig, keygen.ErrNoKey) {
		t.Error("ErrInvalidOptions must not wrap ErrNoKey")
	}
}
