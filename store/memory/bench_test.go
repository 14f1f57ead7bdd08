package memory_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

func newBenchStore(b *testing.B) *memory.Store {
	b.Helper()
	s, err := memory.New(memory.Options{CleanupInterval: -1})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

func benchKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "msg-" + strconv.Itoa(i)
	}
	return keys
}

var benchResult = make([]byte, 256)

var benchCompletion = store.Completion{Status: store.StatusSucceeded, Result: benchResult, TTL: time.Hour}

// BenchmarkBeginComplete is the path of a first delivery: ClaimLease a new key,
// then Complete it with a 256-byte result.
func BenchmarkBeginComplete(b *testing.B) {
	s := newBenchStore(b)
	ctx := context.Background()
	keys := benchKeys(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "bench", Key: keys[i], LeaseDuration: time.Minute})
		if err != nil || res.Decision != store.DecisionExecute {
			b.Fatalf("ClaimLease = %v, %v", res.Decision, err)
		}
		if err := s.Complete(ctx, res.Claim, benchCompletion); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBeginCompleteParallel(b *testing.B) {
	s := newBenchStore(b)
	ctx := context.Background()
	keys := benchKeys(b.N)
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := keys[next.Add(1)-1]
			res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "bench", Key: key, LeaseDuration: time.Minute})
			if err != nil || res.Decision != store.DecisionExecute {
				b.Fatalf("ClaimLease = %v, %v", res.Decision, err)
			}
			if err := s.Complete(ctx, res.Claim, benchCompletion); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkReplay is the replay decision for a duplicate of a finished key.
func BenchmarkReplay(b *testing.B) {
	s := newBenchStore(b)
	ctx := context.Background()
	req := store.LeaseRequest{Scope: "bench", Key: "msg-1", Fingerprint: "fp", LeaseDuration: time.Minute}
	res, err := s.ClaimLease(ctx, req)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Complete(ctx, res.Claim, benchCompletion); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		res, err := s.ClaimLease(ctx, req)
		if err != nil || res.Decision != store.DecisionReplay {
			b.Fatalf("ClaimLease = %v, %v", res.Decision, err)
		}
	}
}

func BenchmarkReplayParallel(b *testing.B) {
	s := newBenchStore(b)
	ctx := context.Background()
	keys := benchKeys(1024)
	for _, key := range keys {
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "bench", Key: key, LeaseDuration: time.Minute})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(ctx, res.Claim, benchCompletion); err != nil {
			b.Fatal(err)
		}
	}
	var goroutines atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		// A counter per goroutine: a shared one would be the hottest cache
		// line in the benchmark.
		i := int(goroutines.Add(1)) * 397
		for pb.Next() {
			i++
			key := keys[i%len(keys)]
			res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "bench", Key: key, LeaseDuration: time.Minute})
			if err != nil || res.Decision != store.DecisionReplay {
				b.Fatalf("ClaimLease = %v, %v", res.Decision, err)
			}
		}
	})
}

// BenchmarkBeginInProgress is a duplicate that finds the key leased.
func BenchmarkBeginInProgress(b *testing.B) {
	s := newBenchStore(b)
	ctx := context.Background()
	req := store.LeaseRequest{Scope: "bench", Key: "msg-1", Fingerprint: "fp", LeaseDuration: time.Hour}
	if _, err := s.ClaimLease(ctx, req); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		res, err := s.ClaimLease(ctx, req)
		if err != nil || res.Decision != store.DecisionHeld {
			b.Fatalf("ClaimLease = %v, %v", res.Decision, err)
		}
	}
}
