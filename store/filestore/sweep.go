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
	err := s.db.View(func(tx *bolt.Tx) error {
		now := s.clock().UnixNano()
		c := tx.Bucket(recordsBucket).Cursor()
		for k, v := c.First(); k != nil && len(found) < limit; k, v = c.Next() {
			if ok, err := sweepable(k, v, now); err != nil {
				return err
			} else if ok {
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
			ok, err := sweepable(k, b.Get(k), now)
			if err != nil {
				return err
			}
			if !ok {
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

// sweepable says whether the record k, v (nil: absent) has expired and
// passed its claim's Retain at now.
func sweepable(k, v []byte, now int64) (bool, error) {
	if v == nil {
		return false, nil
	}
	expires, purge, err := expiry(v)
	if err != nil {
		return false, fmt.Errorf("record %q: %w", k, err)
	}
	return now >= expires && now >= purge, nil
}
