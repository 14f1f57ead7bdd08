package tiered_test

import (
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/storetest"
	"github.com/oncemill/oncemill/store/tiered"
)

// The contract suite runs the one-transaction mode's subtests for a
// store.Transactional; this would not compile if the store were not one.
var _ store.Transactional = (*tiered.Store)(nil)

// TestContract runs the store contract suite against the tiered store over
// the real PostgreSQL and Redis. The subtests share the table and the Redis
// prefix (each uses its own scope). Advance moves time in every tier at
// once: the truth's deadlines and Redis's TTLs move d earlier, and the
// store's local clock d forward, so that expiry stays consistent across
// the tiers. The one-transaction mode's contract runs too (Transactional/).
func TestContract(t *testing.T) {
	w := newWorld(t)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		s := w.store(t, tiered.Options{})
		return storetest.Harness{Store: s, Advance: func(d time.Duration) { w.advance(t, d) }}
	})
}

// The suite again with the local tier off: every replay the caches answer
// comes from Redis, the one-transaction mode's included.
func TestContractRedisTierOnly(t *testing.T) {
	w := newWorld(t)
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		s := w.store(t, tiered.Options{LocalCapacity: -1})
		return storetest.Harness{Store: s, Advance: func(d time.Duration) { w.advance(t, d) }}
	})
}
