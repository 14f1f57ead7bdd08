package memory

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/storetest"
)

// len counts the records held, expired or not.
func (s *Store) len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for i := range sh.slots {
			if sh.slots[i].used {
				n++
			}
		}
		sh.mu.Unlock()
	}
	return n
}

func TestSweeperRemovesExpired(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := New(Options{Now: clock.Now, CleanupInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()

	begin := func(key string, lease time.Duration) store.Claim {
		t.Helper()
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Key: key, LeaseDuration: lease})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("Begin(%q) = %v, %v; want execute", key, res.Decision, err)
		}
		return res.Claim
	}
	for _, key := range []string{"a", "b", "c"} {
		if err := s.Complete(ctx, begin(key, time.Minute), store.Completion{Status: store.StatusSucceeded, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	begin("crashed", time.Minute)
	if err := s.Release(ctx, begin("released", time.Minute), store.Completion{Status: store.StatusRetryable, TTL: time.Minute}); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, begin("live", time.Minute), store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}

	clock.Advance(2 * time.Minute)
	testenv.WaitFor(t, 10*time.Second, "the sweeper to leave one record", func() bool { return s.len() == 1 })
	if _, err := s.Get(ctx, "", "live"); err != nil {
		t.Fatalf("the sweeper removed a live record: %v", err)
	}
}

func TestSweeperDisabled(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := New(Options{Now: clock.Now, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.stop != nil || s.done != nil {
		t.Fatal("a sweeper was started with a negative CleanupInterval")
	}
	ctx := context.Background()
	if _, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "k", LeaseDuration: time.Second}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Minute)
	if n := s.len(); n != 1 {
		t.Fatalf("%d records held, want the expired one still there", n)
	}
	if n, err := s.deleteExpired(ctx, 10); err != nil || n != 1 {
		t.Fatalf("deleteExpired = %d, %v; want 1", n, err)
	}
}

func TestCloseStopsSweeper(t *testing.T) {
	t.Parallel()
	s, err := New(Options{CleanupInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Concurrent Closes all return only once the sweeper has exited.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			select {
			case <-s.done:
			default:
				t.Error("Close returned before the sweeper exited")
			}
		})
	}
	wg.Wait()
}

func TestShardPadding(t *testing.T) {
	t.Parallel()
	if size := unsafe.Sizeof(shard{}); size < 64 {
		t.Fatalf("shard is %d bytes; neighbouring shards would share a cache line", size)
	}
}

// The whole contract again with every key hashing alike, so each record sits
// on one collision chain: finding, replacing, removing and sweeping through
// chains is exercised, which 64-bit hashes of real keys never do.
func TestContractAllKeysCollide(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		// Each subtest has a store and a clock of its own, so Advance
		// moves no other subtest's time: the subtests may run in parallel.
		t.Parallel()
		clock := storetest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
		s, err := New(Options{Now: clock.Now, CleanupInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		s.hash = func(string, string) uint64 { return 42 }
		t.Cleanup(func() { s.Close() })
		return storetest.Harness{Store: s, Advance: clock.Advance}
	})
}

func TestCollisionChainRemoval(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC))
	s, err := New(Options{Now: clock.Now, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.hash = func(string, string) uint64 { return 7 }
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d"} {
		if _, err := s.ClaimLease(ctx, store.LeaseRequest{Key: k, LeaseDuration: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	// Remove from the middle, the head and the tail of the chain.
	for _, k := range []string{"b", "d", "a"} {
		rec, err := s.Get(ctx, "", k)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(ctx, "", k, rec.Token); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Get(ctx, "", k); err == nil {
			t.Fatalf("%s still found after Delete", k)
		}
	}
	if rec, err := s.Get(ctx, "", "c"); err != nil || rec.Key != "c" {
		t.Fatalf("the remaining key: %+v %v", rec, err)
	}
	if n := s.len(); n != 1 {
		t.Fatalf("%d records left, want 1", n)
	}
}

// Records rewritten and removed leave waste in their shard's text until it
// is compacted; the records kept must read back whole afterwards, from
// reused slots too.
func TestTextCompaction(t *testing.T) {
	t.Parallel()
	s, err := New(Options{Shards: 1, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	result := func(i int) []byte { return []byte(strings.Repeat(strconv.Itoa(i), 100)) }
	const n = 400
	written := 0
	for i := range n {
		key := "k" + strconv.Itoa(i)
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: key, Fingerprint: "fp" + key, MessageUUID: "m" + key, LeaseDuration: time.Minute})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimLease(%s) = %v, %v", key, res.Decision, err)
		}
		if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: result(i), TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		written += len("s"+key+"fp"+key+"m"+key) + len(result(i))
		if i%4 != 0 { // three records in four go: their text is waste
			if err := s.Delete(ctx, "s", key, res.Claim.Token); err != nil {
				t.Fatal(err)
			}
		}
	}
	sh := &s.shards[0]
	if len(sh.text) > written*3/4 {
		t.Fatalf("%d bytes of text, of %d written, three in four deleted: never compacted", len(sh.text), written)
	}
	for i := range n {
		key := "k" + strconv.Itoa(i)
		rec, err := s.Get(ctx, "s", key)
		if i%4 != 0 {
			if err == nil {
				t.Fatalf("%s found after Delete", key)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.Scope != "s" || rec.Key != key || rec.Fingerprint != "fp"+key || rec.MessageUUID != "m"+key || !bytes.Equal(rec.Result, result(i)) {
			t.Fatalf("%s read back as %+v", key, rec)
		}
	}
	if got := len(sh.slots); got > n/4+1 {
		t.Fatalf("%d slots for %d records: freed slots are not reused", got, n/4)
	}
}
