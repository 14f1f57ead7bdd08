package postgres

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// Reading and deleting records by key (store.Store.Get, store.Admin), in
// either mode: a record is a row of the table, in either layout.

// Get implements store.Store. An in-progress record whose lease has expired
// is not returned, like any other expired record. A one-transaction claim
// is invisible until its commit.
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := s.checkID("get", scope, key); err != nil {
		return store.Record{}, err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "get", 0)
	if err != nil {
		return store.Record{}, err
	}
	defer s.gate.Leave(cancel)
	rec, err := scanRecord(s.pool.QueryRow(ctx, s.sql.get, scope, key))
	if errors.Is(err, pgx.ErrNoRows) {
		return store.Record{}, fmt.Errorf("oncemill: postgres: get %q/%q: %w", scope, key, store.ErrNotFound)
	}
	if err != nil {
		return store.Record{}, wrap("get", err)
	}
	return rec, nil
}

// scanRecord reads a row of recordColumns.
func scanRecord(row pgx.Row) (store.Record, error) {
	var (
		rec     store.Record
		status  int16
		attempt int32
		kind    string
		retryAt *time.Time
	)
	err := row.Scan(&rec.Scope, &rec.Key, &rec.Fingerprint, &status, &rec.Token, &attempt,
		&rec.Result, &kind, &rec.ErrorMessage, &rec.CreatedAt, &rec.UpdatedAt, &rec.ExpiresAt, &rec.MessageUUID, &retryAt)
	if retryAt != nil {
		rec.RetryAt = *retryAt
	}
	rec.Status, rec.Attempt, rec.ErrorKind = store.Status(status), int(attempt), store.ErrorKind(kind)
	if rec.Status == store.StatusInProgress {
		rec.LeaseExpiresAt = rec.ExpiresAt
	}
	return rec, err
}

// Delete implements store.Admin: one statement, which deletes the row only
// under token and says why it did not.
func (s *Store) Delete(ctx context.Context, scope, key string, token int64) error {
	if err := s.checkID("delete", scope, key); err != nil {
		return err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "delete", 0)
	if err != nil {
		return err
	}
	defer s.gate.Leave(cancel)
	var deleted, exists bool
	if err := s.pool.QueryRow(ctx, s.sql.del, scope, key, token).Scan(&deleted, &exists); err != nil {
		return wrap("delete", err)
	}
	switch {
	case deleted:
		return nil
	case exists:
		return fmt.Errorf("oncemill: postgres: delete %q/%q with token %d: the record has another token now: %w", scope, key, token, store.ErrLeaseLost)
	}
	return fmt.Errorf("oncemill: postgres: delete %q/%q: %w", scope, key, store.ErrNotFound)
}

// List implements store.Admin: one statement per page, in primary key
// order, bounded by Options.StatementTimeout.
func (s *Store) List(ctx context.Context, req store.ListRequest) (store.ListPage, error) {
	afterScope, afterKey, limit, err := requests.Page(req)
	if err != nil {
		return store.ListPage{}, fmt.Errorf("oncemill: postgres: list: %w", err)
	}
	ctx, cancel, err := s.gate.Enter(ctx, "list", 0)
	if err != nil {
		return store.ListPage{}, err
	}
	defer s.gate.Leave(cancel)
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
