package filestore

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// The benchmarks run on a file store and, side by side, on the memory store
// (docs/benchmarks.md, File store):
//
//	go test -run '^$' -bench . -benchtime 2000x ./store/filestore/
//	go test -run '^$' -bench NewKeyParallel/file -benchtime 100000x ./store/filestore/

type benchStore interface {
	store.Store
	Close() error
}

// stores returns the stores the benchmarks compare, built fresh for b, and
// the file of the file store.
var stores = []struct {
	name string
	open func(b *testing.B) (benchStore, string)
}{
	{"file", func(b *testing.B) (benchStore, string) {
		path := filepath.Join(b.TempDir(), "oncemill.db")
		s, err := New(Options{Path: path, CleanupInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		return s, path
	}},
	{"memory", func(b *testing.B) (benchStore, string) {
		s, err := memory.New(memory.Options{CleanupInterval: -1})
		if err != nil {
			b.Fatal(err)
		}
		return s, ""
	}},
}

func openBench(b *testing.B, i int) (benchStore, string) {
	b.Helper()
	s, path := stores[i].open(b)
	b.Cleanup(func() { s.Close() })
	return s, path
}

var benchCompletion = store.Completion{Status: store.StatusSucceeded, Result: make([]byte, 256), TTL: time.Hour}

func newKey(b *testing.B, s store.Store, key string) {
	res, err := s.ClaimLease(context.Background(), store.LeaseRequest{Scope: "bench", Key: key, Fingerprint: "fp", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		b.Fatalf("ClaimLease(%q) = %v, %v", key, res.Decision, err)
	}
	if err := s.Complete(context.Background(), res.Claim, benchCompletion); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkNewKey is a first delivery: ClaimLease of a fresh key, then
// Complete with a 256-byte result, one at a time. The file store syncs the
// file twice. file-bytes/record is the file's size over the records in it.
func BenchmarkNewKey(b *testing.B) {
	for i, st := range stores {
		b.Run(st.name, func(b *testing.B) {
			s, path := openBench(b, i)
			b.ReportAllocs()
			n := 0
			for b.Loop() {
				newKey(b, s, "msg-"+strconv.Itoa(n))
				n++
			}
			reportSize(b, s, path, n)
		})
	}
}

// BenchmarkNewKeyParallel is first deliveries from 32 goroutines: the file
// store commits the claims and completions that wait together in one
// transaction, with one sync.
func BenchmarkNewKeyParallel(b *testing.B) {
	for i, st := range stores {
		b.Run(st.name, func(b *testing.B) {
			s, path := openBench(b, i)
			var next atomic.Int64
			b.ReportAllocs()
			b.SetParallelism(16) // 32 goroutines on 2 CPUs
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					newKey(b, s, "msg-"+strconv.FormatInt(next.Add(1), 10))
				}
			})
			reportSize(b, s, path, int(next.Load()))
		})
	}
}

// BenchmarkReplay is a duplicate of a finished key: ClaimLease answers
// DecisionReplay with the record, from a read transaction in the file store.
func BenchmarkReplay(b *testing.B) {
	for i, st := range stores {
		b.Run(st.name, func(b *testing.B) {
			s, _ := openBench(b, i)
			newKey(b, s, "msg-1")
			req := store.LeaseRequest{Scope: "bench", Key: "msg-1", Fingerprint: "fp", LeaseDuration: time.Minute}
			b.ReportAllocs()
			for b.Loop() {
				res, err := s.ClaimLease(context.Background(), req)
				if err != nil || res.Decision != store.DecisionReplay {
					b.Fatalf("ClaimLease = %v, %v", res.Decision, err)
				}
			}
		})
	}
}

// reportSize closes s and reports the file's size over its records, and
// the bytes of the records' bbolt pages in use (keys, values and page
// headers) over its records: the file has room to grow into beyond them.
func reportSize(b *testing.B, s benchStore, path string, records int) {
	if path == "" || records == 0 {
		return
	}
	if err := s.Close(); err != nil {
		b.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	db, err := bolt.Open(path, 0o600, &bolt.Options{ReadOnly: true})
	if err != nil {
		b.Fatal(err)
	}
	defer db.Close()
	var st bolt.BucketStats
	if err := db.View(func(tx *bolt.Tx) error { st = tx.Bucket(recordsBucket).Stats(); return nil }); err != nil {
		b.Fatal(err)
	}
	if st.KeyN != records {
		b.Fatalf("%d records in the file, want %d", st.KeyN, records)
	}
	b.ReportMetric(float64(fi.Size())/float64(records), "file-bytes/record")
	b.ReportMetric(float64(st.LeafInuse+st.BranchInuse)/float64(records), "inuse-bytes/record")
}
