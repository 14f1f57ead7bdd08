package memory

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// List implements store.Admin. It reads every shard for each page: it is
// for operators and tests, not for the delivery path.
func (s *Store) List(_ context.Context, req store.ListRequest) (store.ListPage, error) {
	afterScope, afterKey, limit, err := requests.Page(req)
	if err != nil {
		return store.ListPage{}, fmt.Errorf("oncemill: memory: list: %w", err)
	}
	if err := s.checkOpen("list"); err != nil {
		return store.ListPage{}, err
	}
	var found []store.Record
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for j := range sh.slots {
			rec := &sh.slots[j]
			if !rec.used {
				continue
			}
			if req.After != "" && cmp.Or(cmp.Compare(string(sh.field(rec, textScope)), afterScope), cmp.Compare(string(sh.field(rec, textKey)), afterKey)) <= 0 {
				continue
			}
			if r := s.snapshot(sh, rec); requests.Matches(req, r) {
				found = append(found, r)
			}
		}
		sh.mu.Unlock()
	}
	slices.SortFunc(found, func(a, b store.Record) int {
		return cmp.Or(cmp.Compare(a.Scope, b.Scope), cmp.Compare(a.Key, b.Key))
	})
	page := store.ListPage{Records: found}
	if len(found) > limit {
		page.Records = found[:limit:limit]
		last := page.Records[limit-1]
		page.Next = requests.Cursor(last.Scope, last.Key)
	}
	return page, nil
}
