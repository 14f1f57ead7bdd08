package filestore

import (
	"bytes"
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// sweepBatch bounds the records one sweeping transaction removes, so that
// claims waiting for the writer's lock wait for a short transaction.
const sweepBatch = 1000

func (s *Store) sweep(interval time.Duration) {
	defer close(s.done)
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-ticker.C:
		}
		// Batches until one is not full, unless Close comes first. An error
		// ends this pass; the next tick tries again.
		for n := sweepBatch; n == sweepBatch && !s.closed.Load(); {
			var err error
			if n, err = s.deleteExpired(context.Background(), sweepBatch); err != nil {
				break
			}
		}
	}
}

// deleteExpired removes up to limit records that have expired and whose
// LeaseRequest.Retain has passed, expired leases included (the next
// ClaimLease of such a key then starts again at attempt 1). It finds them
// in a read transaction, reading the values' headers only, so that the walk
// through the file does not hold up the writes; the write transaction
// checks each again before removing it.
func (s *Store) deleteExpired(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("oncemill: filestore: delete expired: %w", err)
	}
	var found [][]byte
	err := s.view(func(tx *bolt.Tx) error {
		now := s.clock().UnixNano()
		c := tx.Bucket(recordsBucket).Cursor()
		for k, v := c.First(); k != nil && len(found) < limit; k, v = c.Next() {
			if sweepable(v, now) {
				found = append(found, bytes.Clone(k)) // k lives as long as tx
			}
		}
		return nil
	})
	if err != nil {
		return 0, s.fail("delete expired", err)
	}
	if len(found) == 0 {
		return 0, nil
	}
	removed := 0
	err = s.writes.update(func(tx *bolt.Tx) error {
		removed = 0
		now := s.clock().UnixNano()
		b := tx.Bucket(recordsBucket)
		for _, k := range found {
			// Claimed again meanwhile, or removed: kept, or nothing to do.
			if !sweepable(b.Get(k), now) {
				continue
			}
			if err := b.Delete(k); err != nil {
				return err
			}
			removed++
		}
		return nil
	})
	if err != nil {
		return 0, s.fail("delete expired", err)
	}
	return removed, nil
}

// sweepable says whether the record v (nil: absent) has expired and
// passed its claim's Retain at now. A value too short for its header is
// removed: kept, it would hold the sweeper there on every pass.
func sweepable(v []byte, now int64) bool {
	if v == nil {
		return false
	}
	expires, purge, err := expiry(v)
	if err != nil {
		return true
	}
	return now >= expires && now >= purge
}
