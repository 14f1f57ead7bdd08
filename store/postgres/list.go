package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// List implements store.Admin: one statement per page, in primary key
// order, bounded by Options.StatementTimeout.
func (s *Store) List(ctx context.Context, req store.ListRequest) (store.ListPage, error) {
	afterScope, afterKey, limit, err := requests.Page(req)
	if err != nil {
		return store.ListPage{}, fmt.Errorf("oncemill: postgres: list: %w", err)
	}
	ctx, cancel, err := s.enter(ctx, "list", 0)
	if err != nil {
		return store.ListPage{}, err
	}
	defer s.leave(cancel)
	var before any // NULL: no bound
	if !req.UpdatedBefore.IsZero() {
		before = req.UpdatedBefore
	}
	rows, err := s.pool.Query(ctx, s.sql.list, req.Scope, int16(req.Status), before, afterScope, afterKey, limit+1, req.MessageUUID)
	if err != nil {
		return store.ListPage{}, wrap("list", err)
	}
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (store.Record, error) { return scanRecord(row) })
	if err != nil {
		return store.ListPage{}, wrap("list", err)
	}
	page := store.ListPage{Records: recs}
	if len(recs) > limit {
		page.Records = recs[:limit:limit]
		last := page.Records[limit-1]
		page.Next = requests.Cursor(last.Scope, last.Key)
	}
	return page, nil
}
