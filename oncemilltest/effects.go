package oncemilltest

import (
	"maps"
	"slices"
	"sync"
	"testing"
)

// Effects counts a handler's side effects by key: the handler calls Add
// where its real effect would be (the charge, the e-mail, the row), and the
// test asserts each happened once. Counting the effect, not the handler's
// runs, is the point: after a crash the handler runs again, and an
// idempotent effect still happens once.
//
// The zero value is ready to use. It is safe for concurrent use.
type Effects struct {
	mu     sync.Mutex
	counts map[string]int
}

// Add counts one effect for key and returns how many key now has.
func (e *Effects) Add(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.counts == nil {
		e.counts = map[string]int{}
	}
	e.counts[key]++
	return e.counts[key]
}

// Count returns how many effects key has.
func (e *Effects) Count(key string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.counts[key]
}

// RequireCount fails the test unless key has n effects: 1 for a message
// that must take effect once, 0 for one that must not (a cached failure,
// an invalid message).
func (e *Effects) RequireCount(t testing.TB, key string, n int) {
	t.Helper()
	if got := e.Count(key); got != n {
		t.Fatalf("oncemilltest: %q took effect %d times, want %d", key, got, n)
	}
}

// RequireEachOnce fails the test unless at least one key has effects and
// every key has exactly one: for integration tests that push many messages
// through a router with DuplicatingMiddleware.
func (e *Effects) RequireEachOnce(t testing.TB) {
	t.Helper()
	e.mu.Lock()
	counts := maps.Clone(e.counts)
	e.mu.Unlock()
	if len(counts) == 0 {
		t.Fatalf("oncemilltest: no effect at all, want each key once")
	}
	wrong := false
	for _, key := range slices.Sorted(maps.Keys(counts)) {
		if n := counts[key]; n != 1 {
			t.Errorf("oncemilltest: %q took effect %d times, want 1", key, n)
			wrong = true
		}
	}
	if wrong { // every wrong key reported, then stop like the other Require
		t.FailNow()
	}
}
