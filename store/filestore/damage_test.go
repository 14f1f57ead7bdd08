package filestore

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/oncemill/oncemill/store"
)

const damageScope = "billing"

func damageKey(i int) string { return fmt.Sprintf("k-%04d", i) }

// storeFile is a store file of 500 succeeded records, written in the
// store's encoding in one transaction, and the type of each of its pages
// ("meta", "freelist", "leaf", "branch" or "free"). It is built once.
var storeFile = sync.OnceValues(func() ([]byte, []string) {
	dir, err := os.MkdirTemp("", "filestore-damage")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "oncemill.db")
	s, err := New(Options{Path: path, CleanupInterval: -1})
	if err != nil {
		panic(err)
	}
	now := time.Now().UTC()
	err = s.writes.update(func(tx *bolt.Tx) error {
		for i := range 500 {
			e := &entry{Record: store.Record{Status: store.StatusSucceeded, Result: bytes.Repeat([]byte("r"), 256),
				Token: int64(i + 1), Attempt: 1, CreatedAt: now, UpdatedAt: now, ExpiresAt: now.Add(time.Hour)}}
			if err := save(tx, recordKey(damageScope, damageKey(i)), e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		panic(err)
	}
	var types []string
	err = s.db.View(func(tx *bolt.Tx) error {
		for id := 0; ; id++ {
			info, err := tx.Page(id)
			if err != nil || info == nil {
				return err
			}
			types = append(types, info.Type)
		}
	})
	if err != nil {
		panic(err)
	}
	if err := s.Close(); err != nil {
		panic(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		panic(err)
	}
	return b, types
})

// writeFile writes b to a new file in t's directory and returns its path.
func writeFile(t *testing.T, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "oncemill.db")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// garble overwrites b[off:off+n] (within b) with a pattern no page header
// or record holds.
func garble(b []byte, off, n int) []byte {
	b = bytes.Clone(b)
	for i := off; i < min(off+n, len(b)); i++ {
		b[i] = byte(0xA5 ^ i)
	}
	return b
}

// mustRefuse checks that New refuses the file at path, naming it, and
// leaves its bytes as they were.
func mustRefuse(t *testing.T, path string) {
	t.Helper()
	before, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Path: path, CleanupInterval: -1})
	if err == nil {
		s.Close()
		t.Fatal("New opened a damaged file")
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("New's error %q does not name the file", err)
	}
	after, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(before, after) {
		t.Errorf("New changed the damaged file (%d bytes, was %d)", len(after), len(before))
	}
}

// A damaged page of any kind the records depend on, and a truncated file,
// are refused by New with an error that names the file, which is left as
// it was.
func TestFileStoreCorruptionIsAnError(t *testing.T) {
	t.Parallel()
	b, types := storeFile()
	const page = 4096
	if len(b) < len(types)*page {
		t.Fatalf("the file has %d bytes and %d pages", len(b), len(types))
	}
	t.Run("both meta pages", func(t *testing.T) {
		mustRefuse(t, writeFile(t, garble(b, 0, 2*page)))
	})
	seen := map[string]int{}
	for id, typ := range types {
		if typ != "leaf" && typ != "branch" && typ != "freelist" {
			continue
		}
		seen[typ]++
		t.Run(fmt.Sprintf("%s page %d", typ, id), func(t *testing.T) {
			mustRefuse(t, writeFile(t, garble(b, id*page, page)))
		})
	}
	if seen["leaf"] < 10 || seen["branch"] == 0 || seen["freelist"] == 0 {
		t.Errorf("the file's pages in use: %v; want leaves, a branch and a free list", seen)
	}
	for _, n := range []int{100, 2*page + 1, len(types) * page / 2, (len(types) - 1) * page} {
		t.Run(fmt.Sprintf("truncated to %d bytes", n), func(t *testing.T) {
			mustRefuse(t, writeFile(t, b[:n]))
		})
	}
}

// Damage that appears while the store has the file open is met by the
// first operation that reads it: every operation returns an error naming
// the file, the writes queued behind a failed commit are not left waiting,
// and Close closes.
func TestDamageFoundLaterIsAnError(t *testing.T) {
	t.Parallel()
	b, _ := storeFile()
	path := writeFile(t, b)
	s, err := New(Options{Path: path, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	lease := func(key string) store.LeaseRequest {
		return store.LeaseRequest{Scope: damageScope, Key: key, LeaseDuration: time.Minute}
	}
	held, err := s.ClaimLease(ctx, lease("new"))
	if err != nil || held.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease before the damage = %v, %v", held.Decision, err)
	}

	// The store's memory map shows what another writer puts in the file:
	// it garbles every page that holds records now.
	var inUse []int
	err = s.db.View(func(tx *bolt.Tx) error {
		for id := 0; ; id++ {
			info, err := tx.Page(id)
			if err != nil || info == nil {
				return err
			}
			if info.Type == "leaf" || info.Type == "branch" {
				inUse = append(inUse, id)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range inUse {
		if _, err := f.WriteAt(garble(make([]byte, 4096), 0, 4096), int64(id)*4096); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	damaged := func(op string, err error) {
		t.Helper()
		if !errors.Is(err, errDamaged) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s on the damaged file: %v; want an error naming %s", op, err, path)
		}
	}
	_, err = s.ClaimLease(ctx, lease(damageKey(7)))
	damaged("ClaimLease", err)
	_, err = s.Get(ctx, damageScope, damageKey(300))
	damaged("Get", err)
	_, err = s.List(ctx, store.ListRequest{Scope: damageScope})
	damaged("List", err)
	var wg sync.WaitGroup
	errs := make([]error, 4)
	for i := range errs {
		wg.Go(func() {
			errs[i] = s.Complete(ctx, held.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour})
		})
	}
	wg.Wait()
	for _, err := range errs {
		damaged("Complete", err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}

// A value that is not a record (the file itself sound) is named by Get and
// List with its scope and key, is overwritten by the next claim rather than
// refused on every delivery, ends the lease of a claim that held it, is
// removed by Delete under any token, and is swept when too short to have
// a header.
func TestUndecodableRecord(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, err := New(Options{Path: filepath.Join(t.TempDir(), "oncemill.db"), CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	put := func(key string, v []byte) {
		t.Helper()
		err := s.writes.update(func(tx *bolt.Tx) error {
			return tx.Bucket(recordsBucket).Put(recordKey(damageScope, key), v)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	badJSON := append(make([]byte, headerLen), "{not json"...)
	undecodable := func(op string, err error, key string) {
		t.Helper()
		if name := fmt.Sprintf("%q/%q", damageScope, key); !errors.Is(err, errUndecodable) || !strings.Contains(err.Error(), name) {
			t.Errorf("%s of a garbled record: %v; want an error naming %s", op, err, name)
		}
	}

	put("garbled", badJSON)
	_, err = s.Get(ctx, damageScope, "garbled")
	undecodable("Get", err, "garbled")
	_, err = s.List(ctx, store.ListRequest{Scope: damageScope})
	undecodable("List", err, "garbled")

	req := store.LeaseRequest{Scope: damageScope, Key: "garbled", Fingerprint: "fp", LeaseDuration: time.Minute}
	res, err := s.ClaimLease(ctx, req)
	if err != nil || res.Decision != store.DecisionExecute || res.Claim.Attempt != 1 {
		t.Fatalf("ClaimLease of a garbled record = %v attempt %d, %v; want a first attempt", res.Decision, res.Claim.Attempt, err)
	}
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: []byte("ok"), TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if res, err := s.ClaimLease(ctx, req); err != nil || res.Decision != store.DecisionReplay || string(res.Record.Result) != "ok" {
		t.Fatalf("ClaimLease after the overwrite = %v %+v, %v; want a replay of %q", res.Decision, res.Record, err, "ok")
	}

	req.Key = "held"
	res, err = s.ClaimLease(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	put("held", badJSON)
	err = s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour})
	undecodable("Complete", err, "held")
	if !errors.Is(err, store.ErrLeaseLost) {
		t.Errorf("Complete of a garbled record: %v; want store.ErrLeaseLost", err)
	}
	if err := s.Delete(ctx, damageScope, "held", 12345); err != nil {
		t.Errorf("Delete of a garbled record: %v", err)
	}
	if _, err := s.Get(ctx, damageScope, "held"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get after Delete: %v; want store.ErrNotFound", err)
	}

	put("short", []byte("x"))
	if n, err := s.DeleteExpired(ctx, 10); err != nil || n != 1 {
		t.Errorf("DeleteExpired with a record shorter than its header = %d, %v; want it removed", n, err)
	}
	if _, err := s.Get(ctx, damageScope, "short"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get after the sweep: %v; want store.ErrNotFound", err)
	}
}

// FuzzFileStorePageCorruption overwrites bytes of a store file at page,
// offset (both taken modulo the file) with data, then opens it and runs
// each operation: New refuses the file naming it, and leaves it as it was,
// or every operation answers, with an error naming the file or the record
// at worst. Nothing panics.
func FuzzFileStorePageCorruption(f *testing.F) {
	const page = 4096
	for _, seed := range []struct {
		page, off int
		data      []byte
	}{
		{0, 0, bytes.Repeat([]byte{0xFF}, 2*page)},  // both meta pages
		{1, 16, []byte{0, 0, 0, 0, 0, 0, 0, 7}},     // the second meta's root
		{2, 0, bytes.Repeat([]byte{0xA5}, page)},    // a whole page
		{3, 0, []byte{9, 9, 9, 9, 9, 9, 9, 9}},      // a page's id
		{40, 300, []byte("}{garbled record")},       // inside a page
		{100, 8, []byte{0xFF, 0xFF}},                // a page's count
		{150, 2000, bytes.Repeat([]byte{0}, 3000)},  // across two pages
		{258, 16, bytes.Repeat([]byte{0x01}, 64)},   // the last page
		{20, 16, []byte{0x10, 0, 0, 0, 0, 0, 0, 0}}, // its first element
	} {
		f.Add(uint16(seed.page), uint16(seed.off), seed.data)
	}
	f.Fuzz(func(t *testing.T, pageID, off uint16, data []byte) {
		base, types := storeFile()
		b := bytes.Clone(base) // storeFile's bytes are shared
		at := (int(pageID)%len(types))*page + int(off)%page
		copy(b[at:], data)
		path := writeFile(t, b)
		s, err := New(Options{Path: path, CleanupInterval: -1})
		if err != nil {
			if !strings.Contains(err.Error(), path) {
				t.Errorf("New's error %q does not name the file", err)
			}
			if after, _ := os.ReadFile(path); !bytes.Equal(after, b) {
				t.Error("New changed the file it refused")
			}
			return
		}
		defer s.Close()
		ctx := t.Context()
		answered := func(op string, err error) {
			t.Helper()
			if err != nil && !errors.Is(err, errDamaged) && !errors.Is(err, errUndecodable) && !errors.Is(err, store.ErrLeaseLost) && !errors.Is(err, store.ErrNotFound) {
				t.Errorf("%s: %v; want an answer or an error naming the damage", op, err)
			}
		}
		for _, key := range []string{damageKey(0), damageKey(250), damageKey(499), "new"} {
			res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: damageScope, Key: key, LeaseDuration: time.Minute})
			answered("ClaimLease", err)
			if err == nil && res.Decision == store.DecisionExecute {
				answered("Complete", s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}))
			}
			_, err = s.Get(ctx, damageScope, key)
			answered("Get", err)
		}
		_, err = s.List(ctx, store.ListRequest{})
		answered("List", err)
		_, err = s.DeleteExpired(ctx, sweepBatch)
		answered("DeleteExpired", err)
		answered("Close", s.Close())
	})
}
