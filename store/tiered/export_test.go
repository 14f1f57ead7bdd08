package tiered

import "time"

// Internals for the tests of package tiered_test.

// AdvanceLocalClock moves the store's local clock forward by d: its local
// entries age by d. The samples of the truth's and Redis's clocks are
// forgotten, since the local clock no longer keeps time with them.
func (s *Store) AdvanceLocalClock(d time.Duration) {
	s.skew.Add(int64(d))
	s.truthClock.reset()
	s.redisClock.reset()
}

// Subscribed reports whether the subscription to invalidations has been
// confirmed.
func (s *Store) Subscribed() bool { return s.subscribed.Load() }

// StopInvalidations ends the subscription to invalidations, as a
// subscription that is down would lose them.
func (s *Store) StopInvalidations() { _ = s.ps.Close() }

// LocalRemaining is how long the local tier still serves (scope, key).
func (s *Store) LocalRemaining(scope, key string) (time.Duration, bool) {
	now := s.now()
	e := s.local.get(id{scope, key}, now)
	if e == nil {
		return 0, false
	}
	return time.Duration(e.deadline - now), true
}

// RedisKey is the Redis key of (scope, key).
func (s *Store) RedisKey(scope, key string) string { return s.redis.key(id{scope, key}) }
