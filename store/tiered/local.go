package tiered

import (
	"hash/maphash"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/oncemill/oncemill/store"
)

// id names one record: a comparable value, so that the local tier looks a
// key up without building a string.
type id struct{ scope, key string }

// entry is a finished record in the local tier. It is never changed after
// it is made; its Result is the tier's own copy and is cloned on the way
// out.
type entry struct {
	rec      store.Record
	deadline int64 // local time it stops being served
}

// localTier is the in-process tier: LRU caches (hashicorp/golang-lru) in
// independently locked shards, so that replays of different keys on many
// goroutines do not queue on one lock. A nil *localTier is the tier turned
// off.
type localTier struct {
	seed     maphash.Seed
	shards   []*lru.Cache[id, *entry]
	maxBytes int
}

// maxShards, and minShardSize: small capacities get fewer shards, so that
// each still holds enough to be an LRU.
const (
	maxShards    = 16
	minShardSize = 64
)

func newLocalTier(capacity, maxBytes int) (*localTier, error) {
	if capacity <= 0 {
		return nil, nil
	}
	n := maxShards
	for n > 1 && capacity/n < minShardSize {
		n /= 2
	}
	l := &localTier{seed: maphash.MakeSeed(), shards: make([]*lru.Cache[id, *entry], n), maxBytes: maxBytes}
	for i := range l.shards {
		c, err := lru.New[id, *entry]((capacity + n - 1) / n)
		if err != nil {
			return nil, err
		}
		l.shards[i] = c
	}
	return l, nil
}

func (l *localTier) shard(k id) *lru.Cache[id, *entry] {
	if len(l.shards) == 1 {
		return l.shards[0]
	}
	return l.shards[maphash.Comparable(l.seed, k)%uint64(len(l.shards))]
}

// get returns k's entry while it is served at local time now.
func (l *localTier) get(k id, now int64) *entry {
	if l == nil {
		return nil
	}
	sh := l.shard(k)
	e, ok := sh.Get(k)
	if !ok {
		return nil
	}
	if now >= e.deadline {
		sh.Remove(k)
		return nil
	}
	return e
}

// fits reports whether rec is small enough for the tier.
func (l *localTier) fits(rec *store.Record) bool {
	return l != nil && len(rec.Result)+len(rec.Fingerprint)+len(rec.ErrorKind)+len(rec.ErrorMessage)+len(rec.MessageUUID) <= l.maxBytes
}

func (l *localTier) add(k id, e *entry) {
	if l != nil {
		l.shard(k).Add(k, e)
	}
}

func (l *localTier) remove(k id) {
	if l != nil {
		l.shard(k).Remove(k)
	}
}

func (l *localTier) purge() {
	if l == nil {
		return
	}
	for _, sh := range l.shards {
		sh.Purge()
	}
}
