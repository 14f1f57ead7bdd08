package idempotency

import (
	"time"

	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/store"
)

// duplicate describes what the store found for a duplicate that ends in
// sentinel. rec is the claim's Record (nil for a key held by another
// transaction); w, the wait for a held key (nil for a finished one).
func (s *idempotency) duplicate(d *delivery, sentinel error, rec *store.Record, w *waiter) *pipeline.DuplicateError {
	e := &pipeline.DuplicateError{Scope: d.event.Scope, Key: d.event.Key, Status: store.StatusInProgress, Err: sentinel}
	if rec != nil {
		e.Status, e.Attempt = rec.Status, rec.Attempt
		if !rec.UpdatedAt.IsZero() {
			e.Age = time.Since(rec.UpdatedAt)
		}
		if rec.Status == store.StatusInProgress && !rec.LeaseExpiresAt.IsZero() {
			e.LeaseLeft = time.Until(rec.LeaseExpiresAt)
		}
	}
	if w != nil && !w.until.IsZero() {
		// The wait began HeldKeyTimeout before w.until.
		e.Waited = max(s.policy.HeldKeyTimeout-time.Until(w.until), 0)
	}
	return e
}
