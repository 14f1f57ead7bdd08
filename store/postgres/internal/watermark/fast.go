package watermark

import (
	"sync"

	"github.com/oncemill/oncemill/store"
)

// The watermark mode's fast path (docs/kafka.md, "The watermark mode"). A
// partition's messages come one at a time, so the process that committed
// offset N usually sees N+1 next, and the row holds what that commit left:
// the claim would only read back what the process already knows. After a
// clean commit the process keeps the partition's watermark (wmCache); the
// claim of the next offset sends nothing: the handler's transaction
// begins with its first statement, BEGIN and statement in one round trip
// (lazytx), and the commit does the claim's work, in COMMIT's round trip,
// with sqlWatermarkCommitFast, which advances the watermark if the row is
// still what a clean commit of an earlier offset left (the watermark at or
// below the offset, no attempt of it counted), and otherwise fails, which
// aborts the transaction, so the COMMIT pipelined after it commits nothing.
// Two owners of a partition are then ordered at the commit, by the row's
// lock, rather than at the claim: the second finds the watermark moved (or
// an attempt counted), rolls back, and its delivery is decided from the row
// (errWatermarkMoved: the stage claims again, the pessimistic way, and
// replays, holds back or runs again).
//
// Everything but a clean commit forgets the partition (a claim takes the
// entry out): a failure, a rollback, a duplicate, an offset below the
// entry, a process's first message of the partition. The next claim then
// takes the pessimistic path (mode.go), which reads the row under its
// lock; so attempts past the first, cached failures and replays go the way
// they went before. The cache never decides anything by itself: the commit
// checks the row.

// Other commit failures that say another transaction got in the way: under
// REPEATABLE READ or SERIALIZABLE, the row updated by another owner since
// the snapshot (or another serialization conflict), and a deadlock with
// another owner's claim. The stage claims again the pessimistic way, which
// decides from the row.
const (
	serializationFailure = "40001"
	deadlockDetected     = "40P01"
)

// wmKnown is what a process knows of a partition after its own commit.
type wmKnown struct {
	next  int64 // the watermark: the next offset
	token int64
}

// wmCache holds, per partition, the watermark this process committed last.
type wmCache struct {
	mu sync.Mutex
	m  map[wmPartition]wmKnown
}

// wmPartition names a partition in the process's maps: a comparable
// struct, so that a claim builds no string to look it up.
type wmPartition struct {
	topic     string
	partition int32
}

func wmPart(pos store.KafkaPosition) wmPartition {
	return wmPartition{pos.Topic, pos.Partition}
}

// take removes the partition's entry and returns it if offset is its
// watermark: the offset right after this process's last commit. Only that
// one: an offset further on means the partition's messages did not come
// here in order (a gap of compaction or a transaction marker, or offsets
// another owner handled, then a rebalance brought the partition back), and
// the row, not the cache, knows what it holds. Taking the entry out means
// every outcome but a clean commit (which puts one back) leaves the
// partition to the pessimistic path.
func (c *wmCache) take(part wmPartition, offset int64) (wmKnown, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.m[part]
	delete(c.m, part)
	return k, ok && offset == k.next
}

func (c *wmCache) put(part wmPartition, k wmKnown) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = map[wmPartition]wmKnown{}
	}
	c.m[part] = k
}
