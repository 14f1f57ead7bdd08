package filestore

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// List implements store.Admin. It walks the file in (scope, key) order from
// the page's start, within the scope when req.Scope is set, in one read
// transaction: writes go on meanwhile.
func (s *Store) List(_ context.Context, req store.ListRequest) (store.ListPage, error) {
	// The cursor is the last record's bbolt key, which holds any scope:
	// requests.Cursor's cannot tell a 0x00 byte of the scope from its end.
	// requests.Page checks the rest of the request.
	_, _, limit, err := requests.Page(req)
	if err != nil {
		return store.ListPage{}, fmt.Errorf("oncemill: filestore: list: %w", err)
	}
	if err := s.checkOpen("list"); err != nil {
		return store.ListPage{}, err
	}
	var prefix, start, after []byte
	if req.Scope != "" {
		prefix = scopePrefix(req.Scope)
		start = prefix
	}
	if req.After != "" {
		after, err = base64.RawURLEncoding.DecodeString(req.After)
		if err == nil {
			_, _, err = splitKey(after)
		}
		if err != nil {
			return store.ListPage{}, fmt.Errorf("oncemill: filestore: list: %w: list cursor %q is not one a List returned", store.ErrInvalidRequest, req.After)
		}
		if bytes.Compare(after, start) > 0 {
			start = after
		}
	}
	var page store.ListPage
	err = s.view(func(tx *bolt.Tx) error {
		c := tx.Bucket(recordsBucket).Cursor()
		k, v := c.First()
		if start != nil {
			k, v = c.Seek(start)
		}
		for ; k != nil && bytes.HasPrefix(k, prefix); k, v = c.Next() {
			if after != nil && bytes.Equal(k, after) {
				continue
			}
			e, err := decodeEntry(k, v)
			if err != nil {
				return err
			}
			if !requests.Matches(req, e.Record) {
				continue
			}
			if len(page.Records) == limit { // one more: there is a next page
				last := page.Records[limit-1]
				page.Next = base64.RawURLEncoding.EncodeToString(recordKey(last.Scope, last.Key))
				return nil
			}
			page.Records = append(page.Records, e.Record)
		}
		return nil
	})
	if err != nil {
		return store.ListPage{}, s.fail("list", err)
	}
	return page, nil
}
