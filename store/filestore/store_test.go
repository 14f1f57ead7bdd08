package filestore_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/filestore"
	"github.com/oncemill/oncemill/store/storetest"
)

var epoch = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)

func TestContract(t *testing.T) {
	t.Parallel()
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		// Each subtest has a file and a clock of its own, so Advance
		// moves no other subtest's time: the subtests may run in parallel.
		t.Parallel()
		clock := storetest.NewClock(epoch)
		s, err := filestore.New(filestore.Options{Path: filepath.Join(t.TempDir(), "oncemill.db"), Now: clock.Now, CleanupInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return storetest.Harness{Store: s, Advance: clock.Advance}
	})
}

// open is a store on path with the sweeper off, closed at the end of the test.
func open(t *testing.T, path string, now func() time.Time) *filestore.Store {
	t.Helper()
	s, err := filestore.New(filestore.Options{Path: path, Now: now, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// What the store records outlives it: a reopened file replays a success,
// keeps an in-flight lease held with its attempt, and keeps counting
// tokens upwards.
func TestReopenKeepsRecords(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	clock := storetest.NewClock(epoch)
	path := filepath.Join(t.TempDir(), "oncemill.db")
	s := open(t, path, clock.Now)
	req := func(key string) store.LeaseRequest {
		return store.LeaseRequest{Scope: "billing", Key: key, Fingerprint: "fp-" + key, LeaseDuration: time.Minute}
	}
	done, err := s.ClaimLease(ctx, req("done"))
	if err != nil {
		t.Fatal(err)
	}
	out := store.Completion{Status: store.StatusSucceeded, Result: []byte("settled"), TTL: time.Hour}
	if err := s.Complete(ctx, done.Claim, out); err != nil {
		t.Fatal(err)
	}
	held, err := s.ClaimLease(ctx, req("held"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = open(t, path, clock.Now)
	res, err := s.ClaimLease(ctx, req("done"))
	if err != nil || res.Decision != store.DecisionReplay || string(res.Record.Result) != "settled" || res.Record.Token != done.Claim.Token {
		t.Fatalf("ClaimLease of the finished key after reopening = %v %+v, %v; want a replay of %q", res.Decision, res.Record, err, "settled")
	}
	if res, err := s.ClaimLease(ctx, req("held")); err != nil || res.Decision != store.DecisionHeld {
		t.Fatalf("ClaimLease of the leased key after reopening = %v, %v; want held", res.Decision, err)
	}
	clock.Advance(2 * time.Minute)
	res, err = s.ClaimLease(ctx, req("held"))
	if err != nil || res.Decision != store.DecisionExecute || !res.Takeover || res.Claim.Attempt != 2 {
		t.Fatalf("ClaimLease after the lease ran out = %v takeover %v attempt %d, %v; want a takeover at attempt 2", res.Decision, res.Takeover, res.Claim.Attempt, err)
	}
	if res.Claim.Token <= held.Claim.Token {
		t.Fatalf("token %d after reopening is not above %d", res.Claim.Token, held.Claim.Token)
	}
}

// A second process, or a second Store in this one, gets ErrLocked after
// OpenTimeout instead of waiting for ever; Close lets it in.
func TestSecondOpenIsLocked(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "oncemill.db")
	first, err := filestore.New(filestore.Options{Path: path, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = filestore.New(filestore.Options{Path: path, OpenTimeout: 200 * time.Millisecond})
	if !errors.Is(err, filestore.ErrLocked) {
		t.Fatalf("second New = %v, want ErrLocked", err)
	}
	if waited := time.Since(start); waited < 100*time.Millisecond {
		t.Fatalf("second New gave up after %v, before its OpenTimeout", waited)
	}
	if !strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), "one file serves one process") {
		t.Errorf("error %q does not say which file and why", err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	second, err := filestore.New(filestore.Options{Path: path, OpenTimeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatalf("New after Close: %v", err)
	}
	second.Close()
}

func TestNotAStoreFile(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "notes.txt")
	if err := os.WriteFile(path, []byte(strings.Repeat("not a bbolt file\n", 512)), 0o600); err != nil {
		t.Fatal(err)
	}
	s, err := filestore.New(filestore.Options{Path: path})
	if err == nil {
		s.Close()
		t.Fatal("New opened a file that is not a store")
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the file", err)
	}
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		name string
		opts filestore.Options
		want string // in the error message; "" means valid
	}{
		{"path only", filestore.Options{}, ""},
		{"no path", filestore.Options{Path: "-"}, "Path is empty"},
		{"negative cleanup disables", filestore.Options{CleanupInterval: -1}, ""},
		{"negative OpenTimeout", filestore.Options{OpenTimeout: -time.Second}, "OpenTimeout is -1s"},
		{"negative MaxKeyLen", filestore.Options{MaxKeyLen: -5}, "MaxKeyLen is -5"},
		{"largest MaxKeyLen", filestore.Options{MaxKeyLen: 30718}, ""},
		{"MaxKeyLen past bbolt's keys", filestore.Options{MaxKeyLen: 30719}, "at most 30718"},
		{"missing directory", filestore.Options{Path: filepath.Join(dir, "missing", "oncemill.db")}, "no such file or directory"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			switch tt.opts.Path {
			case "":
				tt.opts.Path = filepath.Join(dir, strings.Repeat("x", i+1)+".db")
			case "-":
				tt.opts.Path = ""
			}
			s, err := filestore.New(tt.opts)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				s.Close()
				return
			}
			if err == nil {
				s.Close()
				t.Fatalf("New accepted %+v", tt.opts)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New error %q does not mention %q", err, tt.want)
			}
			var ce *oncemill.ConfigError
			if tt.name != "missing directory" && !errors.As(err, &ce) {
				t.Fatalf("New error %T is not a *oncemill.ConfigError", err)
			}
		})
	}
}

func TestMaxKeyLen(t *testing.T) {
	t.Parallel()
	s, err := filestore.New(filestore.Options{Path: filepath.Join(t.TempDir(), "oncemill.db"), MaxKeyLen: 8, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := s.Limits().MaxKeyLen; got != 8 {
		t.Fatalf("MaxKeyLen() = %d, want 8", got)
	}
	ctx := t.Context()
	if _, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "12345678", LeaseDuration: time.Second}); err != nil {
		t.Fatalf("ClaimLease with an 8-byte key: %v", err)
	}
	_, err = s.ClaimLease(ctx, store.LeaseRequest{Key: "123456789", LeaseDuration: time.Second})
	if !errors.Is(err, store.ErrInvalidRequest) || !strings.Contains(err.Error(), "MaxKeyLen 8") {
		t.Fatalf("ClaimLease with a 9-byte key: err = %v, want ErrInvalidRequest naming MaxKeyLen 8", err)
	}
	_, err = s.ClaimLease(ctx, store.LeaseRequest{Scope: strings.Repeat("s", store.MaxScopeLen+1), Key: "k", LeaseDuration: time.Second})
	if !errors.Is(err, store.ErrInvalidRequest) {
		t.Fatalf("ClaimLease with a scope longer than store.MaxScopeLen: err = %v, want ErrInvalidRequest", err)
	}
}

// Scopes and keys are bytes, stored as they are; a fingerprint, stored in
// the record's JSON, must be UTF-8, and an error message that is not comes
// back with U+FFFD.
func TestBytesAndText(t *testing.T) {
	t.Parallel()
	s := open(t, filepath.Join(t.TempDir(), "oncemill.db"), time.Now)
	ctx := t.Context()
	scope, key := "\xff\x00s", "\xfe\x00k"
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: scope, Key: key, Fingerprint: "fp-é", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease = %v, %v", res.Decision, err)
	}
	out := store.Completion{Status: store.StatusCachedFailure, ErrorKind: store.ErrorKindCached, ErrorMessage: "bad \xff byte", TTL: time.Hour}
	if err := s.Complete(ctx, res.Claim, out); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, scope, key)
	if err != nil || rec.Scope != scope || rec.Key != key || rec.Fingerprint != "fp-é" || rec.ErrorMessage != "bad \uFFFD byte" {
		t.Fatalf("Get = %+v, %v", rec, err)
	}
	_, err = s.ClaimLease(ctx, store.LeaseRequest{Key: "k", Fingerprint: "\xff\xfe", LeaseDuration: time.Minute})
	if !errors.Is(err, store.ErrInvalidRequest) || !strings.Contains(err.Error(), "UTF-8") {
		t.Fatalf("ClaimLease with a fingerprint of raw bytes: err = %v, want ErrInvalidRequest naming UTF-8", err)
	}
}

// The longest scope and the longest key allowed fit in a bbolt key.
func TestLongestScopeAndKey(t *testing.T) {
	t.Parallel()
	s, err := filestore.New(filestore.Options{Path: filepath.Join(t.TempDir(), "oncemill.db"), MaxKeyLen: 30718, CleanupInterval: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	scope := strings.Repeat("\x00", store.MaxScopeLen) // every byte escaped: the longest bbolt key
	key := strings.Repeat("k", 30718)
	ctx := t.Context()
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: scope, Key: key, LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease = %v, %v", res.Decision, err)
	}
	if rec, err := s.Get(ctx, scope, key); err != nil || rec.Scope != scope || rec.Key != key {
		t.Fatalf("Get = %d-byte scope, %d-byte key, %v", len(rec.Scope), len(rec.Key), err)
	}
}

// List orders scopes bytewise, a scope before those it is a prefix of,
// whatever bytes they hold.
func TestListOrdersScopesBytewise(t *testing.T) {
	t.Parallel()
	s := open(t, filepath.Join(t.TempDir(), "oncemill.db"), time.Now)
	ctx := t.Context()
	scopes := []string{"b", "a\x00", "a", "", "a\x00\x01", "a\x01", "\xff", "ab", "a\x00\xff"}
	for _, scope := range scopes {
		for _, key := range []string{"k2", "k1"} {
			if _, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: scope, Key: key, LeaseDuration: time.Minute}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var got []string
	for req := (store.ListRequest{Limit: 3}); ; {
		page, err := s.List(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range page.Records {
			got = append(got, r.Scope+"|"+r.Key)
		}
		if page.Next == "" {
			break
		}
		if len(got) > 100 {
			t.Fatalf("List did not end: %q", got)
		}
		req.After = page.Next
	}
	want := []string{"|k1", "|k2", "a|k1", "a|k2", "a\x00|k1", "a\x00|k2", "a\x00\x01|k1", "a\x00\x01|k2",
		"a\x00\xff|k1", "a\x00\xff|k2", "a\x01|k1", "a\x01|k2", "ab|k1", "ab|k2", "b|k1", "b|k2", "\xff|k1", "\xff|k2"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("List order\n got %q\nwant %q", got, want)
	}
	// A scope's records only, though its name is a prefix of others'.
	page, err := s.List(ctx, store.ListRequest{Scope: "a"})
	if err != nil || len(page.Records) != 2 || page.Records[0].Scope != "a" || page.Records[1].Scope != "a" {
		t.Fatalf("List of scope a = %+v, %v; want its 2 records", page.Records, err)
	}
}

func TestSweeperRemovesExpired(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(epoch)
	path := filepath.Join(t.TempDir(), "oncemill.db")
	s, err := filestore.New(filestore.Options{Path: path, Now: clock.Now, CleanupInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := t.Context()
	for _, key := range []string{"a", "b", "live"} {
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Key: key, LeaseDuration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		ttl := time.Minute
		if key == "live" {
			ttl = time.Hour
		}
		if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: ttl}); err != nil {
			t.Fatal(err)
		}
	}
	held := func() int {
		page, err := s.List(ctx, store.ListRequest{})
		if err != nil {
			t.Fatal(err)
		}
		return len(page.Records)
	}
	if n := held(); n != 3 {
		t.Fatalf("%d records before they expire, want 3", n)
	}
	clock.Advance(2 * time.Minute)
	deadline := time.Now().Add(10 * time.Second)
	for held() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("the sweeper left %d records, want 1", held())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := s.Get(ctx, "", "live"); err != nil {
		t.Fatalf("the sweeper removed a live record: %v", err)
	}
}

func TestClose(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "oncemill.db")
	s, err := filestore.New(filestore.Options{Path: path, CleanupInterval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "k", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}

	ops := map[string]error{}
	_, ops["ClaimLease"] = s.ClaimLease(ctx, store.LeaseRequest{Key: "k", LeaseDuration: time.Minute})
	ops["Complete"] = s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Minute})
	ops["Release"] = s.Release(ctx, res.Claim, store.Completion{Status: store.StatusRetryable, TTL: time.Minute})
	_, ops["Extend"] = s.Extend(ctx, res.Claim, time.Minute)
	_, ops["Get"] = s.Get(ctx, "", "k")
	_, ops["List"] = s.List(ctx, store.ListRequest{})
	ops["Delete"] = s.Delete(ctx, "", "k", res.Claim.Token)
	for op, err := range ops {
		if !errors.Is(err, store.ErrClosed) {
			t.Errorf("%s after Close: err = %v, want ErrClosed", op, err)
		}
	}
	// The lock is released: the file opens again.
	again, err := filestore.New(filestore.Options{Path: path, OpenTimeout: 100 * time.Millisecond})
	if err != nil {
		t.Fatalf("New after Close: %v", err)
	}
	again.Close()
}
