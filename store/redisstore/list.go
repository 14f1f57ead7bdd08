package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/requests"
)

// List implements store.Admin. Redis keeps no order, so every page scans
// the keys of every node (SCAN), sorts the identities, and reads the
// records of the page: it is for operators, not for the delivery path.
func (s *Store) List(ctx context.Context, req store.ListRequest) (store.ListPage, error) {
	afterScope, afterKey, limit, err := requests.Page(req)
	if err != nil {
		return store.ListPage{}, fmt.Errorf("oncemill: redis: list: %w", err)
	}
	if err := s.checkOpen("list"); err != nil {
		return store.ListPage{}, err
	}
	type id struct{ scope, key, redisKey string }
	var (
		mu  sync.Mutex
		ids []id
	)
	pattern := recordPattern(s.prefix)
	err = s.eachNode(ctx, func(ctx context.Context, c redis.Cmdable) error {
		iter := c.Scan(ctx, 0, pattern, scanCount).Iterator()
		for iter.Next(ctx) {
			scope, key, ok := parseRecordKey(s.prefix, iter.Val())
			if !ok || req.Scope != "" && scope != req.Scope ||
				req.After != "" && cmp.Or(cmp.Compare(scope, afterScope), cmp.Compare(key, afterKey)) <= 0 {
				continue
			}
			mu.Lock()
			ids = append(ids, id{scope, key, iter.Val()})
			mu.Unlock()
		}
		return iter.Err()
	})
	if err != nil {
		return store.ListPage{}, fmt.Errorf("oncemill: redis: list: %w", err)
	}
	slices.SortFunc(ids, func(a, b id) int { return cmp.Or(cmp.Compare(a.scope, b.scope), cmp.Compare(a.key, b.key)) })
	ids = slices.CompactFunc(ids, func(a, b id) bool { return a.redisKey == b.redisKey }) // SCAN may repeat a key

	var page store.ListPage
	for len(ids) > 0 && len(page.Records) <= limit {
		chunk := ids[:min(len(ids), limit+1)]
		ids = ids[len(chunk):]
		cmds, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, id := range chunk {
				p.Get(ctx, id.redisKey)
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) && !isWrongType(err) {
			return store.ListPage{}, fmt.Errorf("oncemill: redis: list: %w", err)
		}
		for i, cmd := range cmds {
			v, err := cmd.(*redis.StringCmd).Result()
			if isWrongType(err) { // layout 0: migrate it and read it again
				if err = migrate(ctx, s.client, chunk[i].redisKey); err == nil {
					v, err = s.client.Get(ctx, chunk[i].redisKey).Result()
				}
			}
			switch {
			case errors.Is(err, redis.Nil):
				continue // gone since the scan
			case err != nil:
				return store.ListPage{}, fail("list", chunk[i].scope, chunk[i].key, err)
			}
			rec, err := decode(chunk[i].scope, chunk[i].key, v)
			if err != nil {
				return store.ListPage{}, fail("list", chunk[i].scope, chunk[i].key, err)
			}
			if requests.Matches(req, rec.Record) {
				page.Records = append(page.Records, rec.Record)
			}
		}
	}
	if len(page.Records) > limit {
		page.Records = page.Records[:limit:limit]
		last := page.Records[limit-1]
		page.Next = requests.Cursor(last.Scope, last.Key)
	}
	return page, nil
}

// eachNode runs f on every node that holds records: each master of a
// cluster, each shard of a ring, or the one server.
func (s *Store) eachNode(ctx context.Context, f func(context.Context, redis.Cmdable) error) error {
	switch c := s.client.(type) {
	case *redis.ClusterClient:
		return c.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return f(ctx, n) })
	case *redis.Ring:
		return c.ForEachShard(ctx, func(ctx context.Context, n *redis.Client) error { return f(ctx, n) })
	default:
		return f(ctx, s.client)
	}
}
