package filestore

import (
	"context"
	"fmt"

	"github.com/oncemill/oncemill/store"
)

// DeleteExpired is the sweeper's pass bounded to limit records, as a method
// for the tests only: with it the contract suite (storetest.Run) checks
// what the sweeper removes and what it keeps.
func (s *Store) DeleteExpired(ctx context.Context, limit int) (int, error) {
	if limit <= 0 {
		return 0, fmt.Errorf("oncemill: filestore: delete expired: limit is %d, must be positive: %w", limit, store.ErrInvalidRequest)
	}
	if err := s.checkOpen("delete expired"); err != nil {
		return 0, err
	}
	return s.deleteExpired(ctx, limit)
}
