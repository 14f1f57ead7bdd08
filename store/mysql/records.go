package mysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// Reading and deleting records by key (store.Store.Get, store.Admin), in
// either mode: a record is a row of the table.

// scanner is a *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

// scanRecord reads a row of recordColumns, and extra columns after them.
func scanRecord(row scanner, extra ...any) (store.Record, error) {
	var (
		rec                             store.Record
		scope, key, fp, kind, msg, uuid []byte
		status                          int16
		attempt                         int32
		takenOver                       bool
		created, updated, expires       int64
		retryAt                         sql.NullInt64
	)
	dest := append([]any{&scope, &key, &fp, &status, &rec.Token, &attempt, &takenOver, &rec.Result, &kind, &msg, &uuid,
		&created, &updated, &expires, &retryAt}, extra...)
	if err := row.Scan(dest...); err != nil {
		return rec, err
	}
	rec.Scope, rec.Key, rec.Fingerprint, rec.MessageUUID = string(scope), string(key), string(fp), string(uuid)
	rec.Status, rec.Attempt, rec.ErrorKind, rec.ErrorMessage = store.Status(status), int(attempt), store.ErrorKind(kind), string(msg)
	rec.CreatedAt, rec.UpdatedAt, rec.ExpiresAt = time.UnixMicro(created), time.UnixMicro(updated), time.UnixMicro(expires)
	if retryAt.Valid {
		rec.RetryAt = time.UnixMicro(retryAt.Int64)
	}
	if rec.Status == store.StatusInProgress {
		rec.LeaseExpiresAt = rec.ExpiresAt
	}
	return rec, nil
}

// Get implements store.Admin. An in-progress record whose lease has expired
// is not returned, like any other expired record. A one-transaction claim
// is invisible until its commit.
func (s *Store) Get(ctx context.Context, scope, key string) (store.Record, error) {
	if err := checkID("get", scope, key); err != nil {
		return store.Record{}, err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "get", 0)
	if err != nil {
		return store.Record{}, err
	}
	defer s.gate.Leave(cancel)
	rec, err := scanRecord(s.db.QueryRowContext(ctx, s.sql.get, scope, key))
	if errors.Is(err, sql.ErrNoRows) {
		return store.Record{}, fmt.Errorf("oncemill: mysql: get %q/%q: %w", scope, key, store.ErrNotFound)
	}
	if err != nil {
		return store.Record{}, wrap("get", err)
	}
	return rec, nil
}

// Delete implements store.Admin: the row goes only under token.
func (s *Store) Delete(ctx context.Context, scope, key string, token int64) error {
	if err := checkID("delete", scope, key); err != nil {
		return err
	}
	ctx, cancel, err := s.gate.Enter(ctx, "delete", 0)
	if err != nil {
		return err
	}
	defer s.gate.Leave(cancel)
	res, err := s.db.ExecContext(ctx, s.sql.del, scope, key, token)
	if err != nil {
		return wrap("delete", err)
	}
	if n, _ := res.RowsAffected(); n > 0 {
		return nil
	}
	var exists int
	if err := s.db.QueryRowContext(ctx, s.sql.exists, scope, key).Scan(&exists); err != nil {
		return wrap("delete", err)
	}
	if exists > 0 {
		return fmt.Errorf("oncemill: mysql: delete %q/%q with token %d: the record has another token now: %w", scope, key, token, store.ErrLeaseLost)
	}
	return fmt.Errorf("oncemill: mysql: delete %q/%q: %w", scope, key, store.ErrNotFound)
}

// List implements store.Admin: one statement per page, in primary key
// order, bounded by Options.StatementTimeout.
func (s *Store) List(ctx context.Context, req store.ListRequest) (store.ListPage, error) {
	afterScope, afterKey, limit, err := requests.Page(req)
	if err != nil {
		return store.ListPage{}, fmt.Errorf("oncemill: mysql: list: %w", err)
	}
	ctx, cancel, err := s.gate.Enter(ctx, "list", 0)
	if err != nil {
		return store.ListPage{}, err
	}
	defer s.gate.Leave(cancel)
	before := int64(-1) // no bound
	if !req.UpdatedBefore.IsZero() {
		before = req.UpdatedBefore.UnixMicro()
	}
	rows, err := s.db.QueryContext(ctx, s.sql.list, afterScope, afterKey, req.Scope, req.Scope,
		int16(req.Status), int16(req.Status), before, before, req.MessageUUID, req.MessageUUID, limit+1)
	if err != nil {
		return store.ListPage{}, wrap("list", err)
	}
	defer rows.Close()
	var recs []store.Record
	for rows.Next() {
		rec, err := scanRecord(rows)
		if err != nil {
			return store.ListPage{}, wrap("list", err)
		}
		recs = append(recs, rec)
	}
	if err := rows.Err(); err != nil {
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
