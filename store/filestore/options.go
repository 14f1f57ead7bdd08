package filestore

import (
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/store"
)

const (
	defaultCleanupInterval = time.Minute
	defaultOpenTimeout     = time.Second
	defaultMaxKeyLen       = 1024
	// maxMaxKeyLen is the longest key whose bbolt key, with the longest
	// scope escaped before it, fits in bbolt's 32 KiB.
	maxMaxKeyLen = bolt.MaxKeySize - 2*store.MaxScopeLen - 2
)

// Options configure a Store. Path is required; the zero value of every
// other field is its default.
type Options struct {
	// Path is the store's file, created if absent (mode 0600). One process
	// at a time holds it: New waits up to OpenTimeout for another one to
	// let go.
	Path string
	// Now is the store's clock (default time.Now). Every expiry is judged
	// by it, and the times it gives are stored in the file: unlike
	// store/memory's, they are wall-clock times, read again after a
	// restart. Tests pass storetest.Clock.Now.
	Now func() time.Time
	// CleanupInterval is how often expired records are removed from the
	// file (default 1m; a negative value disables the sweeper; zero means
	// the default). Expired records are invisible either way; sweeping
	// frees their pages for new records (the file does not shrink).
	CleanupInterval time.Duration
	// OpenTimeout bounds how long New waits for the file's lock, held by
	// another process that has it open (default 1s; zero means the
	// default). Past it New fails with ErrLocked instead of hanging.
	OpenTimeout time.Duration
	// MaxKeyLen is the longest key in bytes that ClaimLease accepts
	// (default 1024, at most 30718 so that scope and key fit in a bbolt
	// key). Longer keys are refused with store.ErrInvalidRequest: callers
	// hash them with keygen.StorableKey instead of truncating them.
	MaxKeyLen int
}

func (o Options) withDefaults() (Options, error) {
	if o.Path == "" {
		return o, configerr.New("filestore.Options", "Path is empty; set the file the store keeps its records in, such as %q", "oncemill.db")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.CleanupInterval == 0 {
		o.CleanupInterval = defaultCleanupInterval
	}
	switch {
	case o.OpenTimeout == 0:
		o.OpenTimeout = defaultOpenTimeout
	case o.OpenTimeout < 0:
		return o, configerr.New("filestore.Options", "OpenTimeout is %v; use a positive duration, or 0 for the default %v", o.OpenTimeout, defaultOpenTimeout)
	}
	switch {
	case o.MaxKeyLen == 0:
		o.MaxKeyLen = defaultMaxKeyLen
	case o.MaxKeyLen < 0:
		return o, configerr.New("filestore.Options", "MaxKeyLen is %d; use a positive length, or 0 for the default %d", o.MaxKeyLen, defaultMaxKeyLen)
	case o.MaxKeyLen > maxMaxKeyLen:
		return o, configerr.New("filestore.Options", "MaxKeyLen is %d; use at most %d (bbolt keys are at most 32 KiB, scope included)", o.MaxKeyLen, maxMaxKeyLen)
	}
	return o, nil
}
