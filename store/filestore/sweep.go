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
// ClaimLease of such a key then starts again at attempt 1), in one
// transaction. It reads the values' headers only.
func (s *Store) deleteExpired(ctx context.Context, limit int) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("oncemill: filestore: delete expired: %w", err)
	}
	removed := 0
	err := s.writes.update(func(tx *bolt.Tx) error {
		removed = 0
		now := s.clock().UnixNano()
		b := tx.Bucket(recordsBucket)
		var gone [][]byte
		c := b.Cursor()
		for k, v := c.First(); k != nil && len(gone) < limit; k, v = c.Next() {
			expires, purge, err := expiry(v)
			if err != nil {
				return fmt.Errorf("record %q: %w", k, err)
			}
			if now >= expires && now >= purge {
				gone = append(gone, bytes.Clone(k))
			}
		}
		// Deleted after the walk: a bbolt cursor may skip a key after a
		// delete under it.
		for _, k := range gone {
			if err := b.Delete(k); err != nil {
				return err
			}
		}
		removed = len(gone)
		return nil
	})
	if err != nil {
		return 0, s.fail("delete expired", err)
	}
	return removed, nil
}
