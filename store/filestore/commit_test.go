package filestore

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

func openDB(t *testing.T) *bolt.DB {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "commit.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Update(func(tx *bolt.Tx) error { _, err := tx.CreateBucket([]byte("b")); return err }); err != nil {
		t.Fatal(err)
	}
	return db
}

// Writes that arrive while a commit is under way all commit, sharing the
// next transaction. The first write holds its transaction until every other
// write has queued behind it, so the grouping does not depend on how the
// goroutines happen to be scheduled.
func TestCommitterGroupsWrites(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	c := committer{db: db}
	const writers = 64
	var (
		mu      sync.Mutex
		commits = map[*bolt.Tx]bool{}
		wg      sync.WaitGroup
		leading = make(chan struct{})
		once    sync.Once
	)
	write := func(i int) {
		err := c.update(func(tx *bolt.Tx) error {
			mu.Lock()
			commits[tx] = true
			mu.Unlock()
			if i == 0 {
				once.Do(func() { close(leading); waitQueued(t, &c, writers-1) })
			}
			return tx.Bucket([]byte("b")).Put(fmt.Appendf(nil, "k%02d", i), []byte("v"))
		})
		if err != nil {
			t.Error(err)
		}
	}
	wg.Go(func() { write(0) })
	<-leading
	for i := 1; i < writers; i++ {
		wg.Go(func() { write(i) })
	}
	wg.Wait()
	n := 0
	if err := db.View(func(tx *bolt.Tx) error { n = tx.Bucket([]byte("b")).Stats().KeyN; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != writers {
		t.Fatalf("%d keys written, want %d", n, writers)
	}
	if len(commits) > 2 {
		t.Fatalf("%d writes took %d transactions, want 2: the first, and one for the %d queued behind it", writers, len(commits), writers-1)
	}
	if c.busy || len(c.queue) > 0 {
		t.Fatalf("committer left busy %v with %d queued", c.busy, len(c.queue))
	}
}

// waitQueued waits, at most 10 s, until n writes are queued on c.
func waitQueued(t *testing.T, c *committer, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		queued := len(c.queue)
		c.mu.Unlock()
		if queued >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d writes queued after 10 s, want %d", queued, n)
			return
		}
	}
}

// A write that refuses to commit gets its error; the others of its group
// run again without it and commit.
func TestCommitterDropsAFailedWrite(t *testing.T) {
	t.Parallel()
	db := openDB(t)
	c := committer{db: db}
	refuse := errors.New("refused")
	runs := map[string]int{}
	put := func(k string, err error) *write {
		return &write{done: make(chan outcome, 1), fn: func(tx *bolt.Tx) error {
			runs[k]++
			if e := tx.Bucket([]byte("b")).Put([]byte(k), []byte("v")); e != nil {
				return e
			}
			return err
		}}
	}
	group := []*write{put("a", nil), put("bad", refuse), put("c", nil)}
	c.queue, c.busy = group, true
	c.commitQueue()
	for i, want := range []error{nil, refuse, nil} {
		if out := <-group[i].done; !errors.Is(out.err, want) || out.lead {
			t.Errorf("write %d: %+v, want error %v", i, out, want)
		}
	}
	if runs["a"] != 2 || runs["c"] != 1 || runs["bad"] != 1 {
		t.Errorf("runs = %v; want a twice (before and after the refusal), c and bad once", runs)
	}
	err := db.View(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("b"))
		if b.Get([]byte("a")) == nil || b.Get([]byte("c")) == nil || b.Get([]byte("bad")) != nil {
			return errors.New("want a and c committed, bad not")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
