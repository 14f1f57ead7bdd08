package filestore

import (
	"sync"

	bolt "go.etcd.io/bbolt"
)

// committer commits writes in groups: a write that arrives while a commit is
// running waits for the next one, and that commit carries every write
// queued meanwhile, so concurrent claims share one fsync. A write that
// arrives while none is running commits at once. (bbolt's own DB.Batch
// waits for a timer, 10 ms by default, before a batch that is not full: a
// worker that handles one message at a time would wait that long at every
// claim and every completion.)
//
// The writer of a commit is one of the waiting callers, not a goroutine of
// its own: after its commit, it hands the next one to the first caller
// queued meanwhile, and returns.
type committer struct {
	db    *bolt.DB
	mu    sync.Mutex
	queue []*write
	busy  bool // a caller is committing; the queue waits for it
}

// write is one caller's function and where its outcome goes.
type write struct {
	fn   func(*bolt.Tx) error
	done chan outcome // buffered: a result and a lead never block the sender
}

// outcome is a write's result, or lead: the caller is to commit the queue.
type outcome struct {
	err  error
	lead bool
}

// update runs fn in a read-write transaction and returns once it is
// committed (and synced to disk), or failed. fn may run more than once, in
// new transactions, when another write of its group fails: it must assign,
// not accumulate, whatever it reports to its caller. fn returns an error
// only when the transaction must not commit; the group is then committed
// without it.
func (c *committer) update(fn func(*bolt.Tx) error) error {
	w := &write{fn: fn, done: make(chan outcome, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, w)
	lead := !c.busy
	c.busy = true
	c.mu.Unlock()
	if lead {
		c.commitQueue()
	}
	for {
		out := <-w.done
		if !out.lead {
			return out.err
		}
		c.commitQueue()
	}
}

// commitQueue commits every queued write, then hands the lead to the first
// write queued meanwhile, if any.
func (c *committer) commitQueue() {
	c.mu.Lock()
	group := c.queue
	c.queue = nil
	c.mu.Unlock()

	for len(group) > 0 {
		failed := -1
		err := c.commit(func(tx *bolt.Tx) error {
			for i, w := range group {
				if err := w.fn(tx); err != nil {
					failed = i
					return err
				}
			}
			return nil
		})
		if failed < 0 { // committed, or the commit failed for all
			for _, w := range group {
				w.done <- outcome{err: err}
			}
			break
		}
		// One write refused to commit: the others run again without it.
		group[failed].done <- outcome{err: err}
		group = append(group[:failed:failed], group[failed+1:]...)
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.queue) == 0 {
		c.busy = false
		return
	}
	c.queue[0].done <- outcome{lead: true}
}

// commit runs fn in a read-write transaction, a panic of bbolt as an error:
// the writes queued behind it are not left waiting for a lead that died.
func (c *committer) commit(fn func(*bolt.Tx) error) (err error) {
	defer guard()()
	defer recoverDamage(c.db.Path(), &err)
	return c.db.Update(fn)
}
