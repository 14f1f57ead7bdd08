package redisstore_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/internal/storeload"
	"github.com/oncemill/oncemill/store/redisstore"
)

// TestContract runs the contract suite against the real Redis, over a client
// of 4 connections (the suite's ConcurrentStress runs 32 goroutines with 30%
// duplicate keys on it). Each subtest gets a Store on a prefix of its own;
// Advance takes time off the TTLs of its records (export_test.go).
func TestContract(t *testing.T) {
	t.Parallel()
	runContract(t, newClient(t, &redis.Options{PoolSize: 4}), false)
}

// The suite again with Options.AutoPipeline: the commands of concurrent
// calls travel in shared pipelines.
func TestContractAutoPipeline(t *testing.T) {
	t.Parallel()
	runContract(t, newClient(t, &redis.Options{PoolSize: 4}), true)
}

func TestOptionsValidation(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	tests := []struct {
		name string
		opts redisstore.Options
		want string // in the error message; "" means valid
	}{
		{"zero value", redisstore.Options{}, ""},
		{"prefix with colon, slash, dot", redisstore.Options{Prefix: "app-1.prod:oncemill/v2"}, ""},
		{"prefix with space", redisstore.Options{Prefix: "my app"}, `Options: Prefix "my app" has ' ' at byte 2`},
		{"prefix with open brace", redisstore.Options{Prefix: "a{b"}, "no spaces, braces or glob characters"},
		{"prefix with close brace", redisstore.Options{Prefix: "a}b"}, "no spaces, braces or glob characters"},
		{"prefix with glob star", redisstore.Options{Prefix: "a*"}, "no spaces, braces or glob characters"},
		{"prefix with glob class", redisstore.Options{Prefix: "a[b]"}, "no spaces, braces or glob characters"},
		{"prefix with backslash", redisstore.Options{Prefix: `a\b`}, "no spaces, braces or glob characters"},
		{"prefix with NUL", redisstore.Options{Prefix: "a\x00"}, "no spaces, braces or glob characters"},
		{"prefix too long", redisstore.Options{Prefix: strings.Repeat("p", 129)}, "Options: Prefix is 129 bytes; use at most 128"},
		{"negative MaxKeyLen", redisstore.Options{MaxKeyLen: -1}, "Options: MaxKeyLen is -1"},
		{"negative MaxResultBytes", redisstore.Options{MaxResultBytes: -1}, "Options: MaxResultBytes is -1"},
		{"MaxResultBytes above 512 MiB", redisstore.Options{MaxResultBytes: 512<<20 + 1}, "at most 536870912 bytes"},
		{"MaxResultBytes of 512 MiB", redisstore.Options{MaxResultBytes: 512 << 20}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, err := redisstore.New(c, tt.opts)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("New accepted %+v (prefix %q)", tt.opts, s.Prefix())
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New error %q does not mention %q", err, tt.want)
			}
		})
	}

	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": testenv.RedisAddr()}})
	defer ring.Close()
	if _, err := redisstore.New(ring, redisstore.Options{AutoPipeline: true}); err == nil || !strings.Contains(err.Error(), "redis.Options.AutoPipeline") {
		t.Errorf("New(ring, AutoPipeline) = %v, want an error about AutoPipeline", err)
	}
	if _, err := redisstore.New(nil, redisstore.Options{}); err == nil || !strings.Contains(err.Error(), "redis client: nil") {
		t.Errorf("New(nil) = %v, want an error about the nil client", err)
	}
	s := newStore(t, c, redisstore.Options{})
	if s.Prefix() != "oncemill" || s.Limits().MaxKeyLen != 512 {
		t.Errorf("defaults: prefix %q, MaxKeyLen %d; want oncemill, 512", s.Prefix(), s.Limits().MaxKeyLen)
	}
}

func TestMaxKeyLen(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c), MaxKeyLen: 8})
	ctx := t.Context()
	if s.Limits().MaxKeyLen != 8 {
		t.Fatalf("MaxKeyLen() = %d, want 8", s.Limits().MaxKeyLen)
	}
	if _, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "12345678", LeaseDuration: time.Minute}); err != nil {
		t.Fatalf("ClaimLease with an 8-byte key: %v", err)
	}
	_, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "123456789", LeaseDuration: time.Minute})
	if !errors.Is(err, store.ErrInvalidRequest) || !strings.Contains(err.Error(), "longer than MaxKeyLen 8") {
		t.Fatalf("ClaimLease with a 9-byte key: %v; want ErrInvalidRequest naming MaxKeyLen 8", err)
	}
}

func TestMaxResultBytes(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c), MaxResultBytes: 1000})
	ctx := t.Context()
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: make([]byte, 1001), TTL: time.Hour})
	if !errors.Is(err, store.ErrInvalidRequest) || !strings.Contains(err.Error(), "result is 1001 bytes, larger than MaxResultBytes 1000") {
		t.Fatalf("Complete with 1001 bytes: %v; want ErrInvalidRequest naming the sizes", err)
	}
	if rec, err := s.Get(ctx, "s", "k"); err != nil || rec.Status != store.StatusInProgress {
		t.Fatalf("after the refused Complete: %+v, %v; want the lease untouched", rec, err)
	}
	want := bytes.Repeat([]byte{0xff, 0}, 500)
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: want, TTL: time.Hour}); err != nil {
		t.Fatalf("Complete with exactly 1000 bytes: %v", err)
	}
	if rec, err := s.Get(ctx, "s", "k"); err != nil || !bytes.Equal(rec.Result, want) {
		t.Fatalf("Get after Complete: %v, %d bytes", err, len(rec.Result))
	}
}

// tricky identities: each must be its own record, and round-trip as data.
var tricky = [][2]string{
	{"a:b", "c"}, {"a", "b:c"}, {"a:", "b"}, {"a", ":b"}, {"", "a:b"}, {"", "a"}, {"1:a", "b"}, {"1", "a:b"},
	{"scope with spaces", "key with spaces"}, {"scope with spaces", "key  with spaces"},
	{"{", "}"}, {"}", "{"}, {"{a}", "b"}, {"a", "{b}"}, {"{}", "{}"}, {"", "{}"}, {"}{", "x"},
	{`"quoted"`, `'single' "double"`}, {"\\", "\\\\"},
	{"*", "?"}, {"[a-z]", "*"}, {"oncemill:{x}:r:1:a", "b"},
	{"nul\x00", "x"}, {"nul", "\x00x"}, {"\xff\xfe", "\x00\x01\x02"}, {"line\nbreak", "tab\tkey"},
	{"ünïcödé", "ключ"},
	{"lua", "'); redis.call('FLUSHALL') --"}, {"lua", "]] .. redis.call('DEL', KEYS[1]) .. [["},
}

// TestKeysAreData: scopes and keys with separators, braces, quotes, glob
// characters and binary bytes are stored as data. No two of them share a
// record, and each round-trips with its own result.
func TestKeysAreData(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	prefix := testPrefix(t, c)
	s := newStore(t, c, redisstore.Options{Prefix: prefix})
	ctx := t.Context()

	for _, id := range tricky {
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: id[0], Key: id[1], Fingerprint: "fp " + id[0] + id[1], LeaseDuration: time.Minute})
		if err != nil {
			t.Fatalf("Begin(%q, %q): %v", id[0], id[1], err)
		}
		if res.Decision != store.DecisionExecute || res.Claim.Attempt != 1 {
			t.Fatalf("Begin(%q, %q) = %v attempt %d: it collides with an earlier identity (record %+v)",
				id[0], id[1], res.Decision, res.Claim.Attempt, res.Record)
		}
		err = s.Complete(ctx, res.Claim, store.Completion{
			Status: store.StatusSucceeded, Result: []byte(id[0] + "\x00" + id[1]), TTL: time.Hour,
		})
		if err != nil {
			t.Fatalf("Complete(%q, %q): %v", id[0], id[1], err)
		}
	}
	for _, id := range tricky {
		rec, err := s.Get(ctx, id[0], id[1])
		if err != nil {
			t.Fatalf("Get(%q, %q): %v", id[0], id[1], err)
		}
		if string(rec.Result) != id[0]+"\x00"+id[1] || rec.Fingerprint != "fp "+id[0]+id[1] || rec.Scope != id[0] || rec.Key != id[1] {
			t.Errorf("Get(%q, %q) = scope %q key %q fp %q result %q", id[0], id[1], rec.Scope, rec.Key, rec.Fingerprint, rec.Result)
		}
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: id[0], Key: id[1], LeaseDuration: time.Minute})
		if err != nil || res.Decision != store.DecisionReplay {
			t.Errorf("Begin(%q, %q) again = %v, %v; want replay", id[0], id[1], res.Decision, err)
		}
	}

	// Nothing was written outside the prefix's records, and the
	// Lua-looking keys ran nothing.
	records := 0
	for _, k := range listKeys(t, c, prefix) {
		if strings.Contains(k, "}:r:") {
			records++
		} else {
			t.Errorf("unexpected key %q under the prefix", k)
		}
	}
	if records != len(tricky) {
		t.Errorf("%d record keys under the prefix, want %d", records, len(tricky))
	}

	// Delete of one identity leaves its look-alikes alone.
	ab, err := s.Get(ctx, "a:b", "c")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "a:b", "c", ab.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "a:b", "c"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get after Delete: %v, want ErrNotFound", err)
	}
	if rec, err := s.Get(ctx, "a", "b:c"); err != nil || string(rec.Result) != "a\x00b:c" {
		t.Errorf("Delete(a:b, c) touched (a, b:c): %v", err)
	}
}

// TestPrefixesIsolate: stores with different prefixes, one a prefix of the
// other's, share no record, and the clock of one leaves the other alone.
func TestPrefixesIsolate(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	base := testPrefix(t, c)
	outer := newStore(t, c, redisstore.Options{Prefix: base})
	inner := newStore(t, c, redisstore.Options{Prefix: base + ":x"})
	ctx := t.Context()

	for _, s := range []*redisstore.Store{outer, inner} {
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimLease under %q = %v, %v; want execute", s.Prefix(), res.Decision, err)
		}
		if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	redisstore.AdvanceClock(outer, 2*time.Minute)
	if _, err := outer.Get(ctx, "s", "k"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("outer record after its TTL: %v, want ErrNotFound", err)
	}
	if _, err := inner.Get(ctx, "s", "k"); err != nil {
		t.Fatalf("inner record after the outer's TTL: %v", err)
	}
}

// TestConcurrentDuplicates is the concurrency check on a larger
// scale than the contract suite: 32 goroutines share a client of 4
// connections, 30% of 3000 keys are delivered twice, and each key executes
// exactly once.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	c := newClient(t, &redis.Options{PoolSize: 4})
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	storeload.Run(t, s, "stress", 3000)
}

// TestNativeTTLs: each record carries the Redis TTL of its state, which is
// how the store judges expiry: a finished record lives for its outcome's
// TTL, a released one for keep, and an in-progress one for its lease plus
// its tail (the ClaimLease's Retain, or the lease when there is none), after
// which Redis frees it by itself.
func TestNativeTTLs(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx := t.Context()

	pttl := func(key string) time.Duration {
		t.Helper()
		d, err := c.PTTL(ctx, key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	near := func(what string, got, want time.Duration) {
		t.Helper()
		if got > want || got < want-2*time.Second {
			t.Errorf("%s: PTTL = %v, want about %v", what, got, want)
		}
	}
	rec := redisstore.KeysFor(s, "s", "k")

	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: 30 * time.Second, Retain: 10 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	near("in progress", pttl(rec), 30*time.Second+10*time.Minute)
	l, err := s.Extend(ctx, res.Claim, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	near("extended", pttl(rec), time.Minute+10*time.Minute)
	if err := s.Release(ctx, l, store.Completion{Status: store.StatusRetryable, TTL: 5 * time.Minute}); err != nil {
		t.Fatal(err)
	}
	near("released", pttl(rec), 5*time.Minute)
	res, err = s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	near("in progress without a Retain", pttl(rec), 30*time.Second+30*time.Second)
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: 2 * time.Hour}); err != nil {
		t.Fatal(err)
	}
	near("succeeded", pttl(rec), 2*time.Hour)

	// Redis removes an expired record by itself.
	res, err = s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "short", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: 50 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	short := redisstore.KeysFor(s, "s", "short")
	deadline := time.Now().Add(5 * time.Second)
	for c.Exists(ctx, short).Val() == 1 {
		if time.Now().After(deadline) {
			t.Fatal("Redis did not remove a record 5s after its 50ms TTL")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTokensRiseAcrossDelete: a key's next token is above the last one
// after its record was deleted (it comes from the clock), and a lease from
// before the Delete can no longer finish.
func TestTokensRiseAcrossDelete(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx := t.Context()
	req := store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute}
	begin := func() store.Claim {
		t.Helper()
		res, err := s.ClaimLease(ctx, req)
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimLease = %v, %v; want execute", res.Decision, err)
		}
		return res.Claim
	}
	first := begin()
	if err := s.Delete(ctx, "s", "k", first.Token); err != nil {
		t.Fatal(err)
	}
	second := begin()
	if second.Token <= first.Token {
		t.Fatalf("token after Delete = %d, not above %d", second.Token, first.Token)
	}
	if err := s.Complete(ctx, first, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete with the token from before Delete: %v, want ErrLeaseLost", err)
	}
}

// TestMigratesLayoutZero: records of the first layout (a hash per record,
// written by earlier versions) are read and taken over as they were, each
// rewritten in the current layout the first time it is met.
func TestMigratesLayoutZero(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx := t.Context()
	now := time.Now().UnixMicro()
	legacy := func(key string, ttl time.Duration, fields ...any) string {
		t.Helper()
		k := redisstore.KeysFor(s, "s", key)
		if err := c.HSet(ctx, k, fields...).Err(); err != nil {
			t.Fatal(err)
		}
		if err := c.PExpire(ctx, k, ttl).Err(); err != nil {
			t.Fatal(err)
		}
		return k
	}
	done := legacy("done", time.Hour, "status", "succeeded", "token", now, "attempt", 2, "exp", now+3600e6,
		"created", now, "updated", now, "fp", "fp-1", "result", "out\x00put")
	legacy("crashed", time.Hour, "status", "in_progress", "token", now, "attempt", 1, "exp", now-1e6,
		"created", now, "updated", now)
	legacy("failed", time.Hour, "status", "failed", "token", now, "attempt", 3, "exp", now+3600e6,
		"created", now, "updated", now, "ekind", "permanent", "emsg", "card declined")

	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "done", Fingerprint: "fp-1", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionReplay || string(res.Record.Result) != "out\x00put" || res.Record.Attempt != 2 {
		t.Fatalf("ClaimLease of a layout-0 success = %v %+v, %v; want its replay", res.Decision, res.Record, err)
	}
	if typ := c.Type(ctx, done).Val(); typ != "string" {
		t.Fatalf("the record is a %s after ClaimLease, want it rewritten as a string", typ)
	}
	if d := c.PTTL(ctx, done).Val(); d < 59*time.Minute {
		t.Fatalf("the rewritten record's TTL is %v, want its remaining hour", d)
	}
	res, err = s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "crashed", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute || res.Claim.Attempt != 2 || !res.Takeover || res.Claim.Token <= now {
		t.Fatalf("ClaimLease of a layout-0 expired lease = %v attempt %d takeover %v token %d, %v; want a takeover at attempt 2",
			res.Decision, res.Claim.Attempt, res.Takeover, res.Claim.Token, err)
	}
	rec, err := s.Get(ctx, "s", "failed")
	if err != nil || rec.Status != store.StatusCachedFailure || rec.ErrorMessage != "card declined" || rec.Attempt != 3 {
		t.Fatalf("Get of a layout-0 failure = %+v, %v", rec, err)
	}
}

func TestClosedClient(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr()})
	s := newStore(t, c, redisstore.Options{})
	c.Close()
	_, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
	if !errors.Is(err, store.ErrClosed) {
		t.Fatalf("ClaimLease on a closed client: %v, want store.ErrClosed", err)
	}
}

// TestScriptCacheFlushed: EVALSHA falls back to EVAL when Redis lost its
// script cache (a restart, SCRIPT FLUSH).
func TestScriptCacheFlushed(t *testing.T) {
	for _, ap := range []bool{false, true} {
		t.Run(fmt.Sprintf("AutoPipeline=%v", ap), func(t *testing.T) { testScriptCacheFlushed(t, ap) })
	}
}

func testScriptCacheFlushed(t *testing.T, autoPipeline bool) {
	c := newClient(t, nil)
	s := newTestStore(t, c, redisstore.Options{Prefix: testPrefix(t, c), AutoPipeline: autoPipeline})
	ctx := t.Context()
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease after SCRIPT FLUSH = %v, %v", res.Decision, err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
		t.Fatalf("Complete after SCRIPT FLUSH: %v", err)
	}
}

// TestContextCanceled: a canceled context fails fast with its error.
func TestContextCanceled(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute}); !errors.Is(err, context.Canceled) {
		t.Fatalf("ClaimLease with a canceled context: %v", err)
	}
}

// TestRecordMemory: a record is one Redis string; its memory is logged for
// results of several sizes (go test -v -run TestRecordMemory), and a record
// with a small result stays within the minimal layout's 229 bytes measured
// when the layout was chosen.
func TestRecordMemory(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx := t.Context()
	for _, size := range []int{0, 64, 256} {
		key := fmt.Sprintf("result-%d", size)
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "orders", Key: key, Fingerprint: "xxh64:9f86d081884c7d65", LeaseDuration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: bytes.Repeat([]byte("r"), size), TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		record := redisstore.KeysFor(s, "orders", key)
		typ, usage := c.Type(ctx, record).Val(), c.MemoryUsage(ctx, record).Val()
		t.Logf("result of %4d bytes: %s, MEMORY USAGE %d bytes", size, typ, usage)
		if typ != "string" {
			t.Errorf("result of %d bytes: a %s, want a string", size, typ)
		}
		if size == 0 && usage > 229 {
			t.Errorf("a record without a result takes %d bytes, more than 229", usage)
		}
	}
	// The message UUID the pipeline passes (a Watermill UUID, 36 bytes)
	// adds its length and 4 bytes of framing to the value.
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "orders", Key: "uuid", Fingerprint: "xxh64:9f86d081884c7d65", LeaseDuration: time.Minute,
		MessageUUID: "0192f3a4-5b6c-7d8e-9f01-23456789abcd"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	t.Logf("result of    0 bytes, with a message UUID: MEMORY USAGE %d bytes", c.MemoryUsage(ctx, redisstore.KeysFor(s, "orders", "uuid")).Val())
}

// TestMessageUUIDAnyBytes: the message UUID is framed by its length, so
// any bytes round-trip next to a fingerprint that holds the layout's
// separators, and a record without one reads as one of earlier versions.
func TestMessageUUIDAnyBytes(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx := t.Context()
	for key, req := range map[string]store.LeaseRequest{
		"separators": {MessageUUID: "a|b#3:c\x00", Fingerprint: "fp#1:|x|"},
		"no uuid":    {Fingerprint: "#2:ab|"},
		"digits":     {MessageUUID: "12345", Fingerprint: "678"},
	} {
		req.Scope, req.Key, req.LeaseDuration = "s", key, time.Minute
		res, err := s.ClaimLease(ctx, req)
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("%s: ClaimLease = %+v, %v", key, res, err)
		}
		check := func(step string) {
			t.Helper()
			rec, err := s.Get(ctx, "s", key)
			if err != nil || rec.MessageUUID != req.MessageUUID || rec.Fingerprint != req.Fingerprint {
				t.Fatalf("%s, %s: Get = %+v, %v; want message UUID %q and fingerprint %q", key, step, rec, err, req.MessageUUID, req.Fingerprint)
			}
		}
		check("in progress")
		if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
		check("succeeded")
	}
}

// TestLateComplete: a holder whose lease ran out, but whom nobody took over,
// may still Complete (its token proves nobody else ran the key) and Release,
// but not Extend.
func TestLateComplete(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx := t.Context()
	for _, finish := range []string{"complete", "release"} {
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: finish, LeaseDuration: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		redisstore.AdvanceClock(s, 11*time.Second)
		if _, err := s.Extend(ctx, res.Claim, time.Minute); !errors.Is(err, store.ErrLeaseLost) || !strings.Contains(err.Error(), "lease expired") {
			t.Fatalf("Extend of an expired lease: %v, want ErrLeaseLost (lease expired)", err)
		}
		var want store.Status
		if finish == "complete" {
			want = store.StatusSucceeded
			err = s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour})
		} else {
			want = store.StatusRetryable
			err = s.Release(ctx, res.Claim, store.Completion{Status: store.StatusRetryable, TTL: time.Hour})
		}
		if err != nil {
			t.Fatalf("late %s: %v", finish, err)
		}
		if rec, err := s.Get(ctx, "s", finish); err != nil || rec.Status != want {
			t.Fatalf("after the late %s: %v %v, want %v", finish, rec.Status, err, want)
		}
	}
}

// TestForeverTTL: durations of "forever" (math.MaxInt64) count as 100
// years instead of overflowing the scripts' arithmetic.
func TestForeverTTL(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx := t.Context()
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	const century = 100 * 365 * 24 * time.Hour
	if d := time.Until(res.Claim.ExpiresAt); d < century-time.Hour || d > century+time.Hour {
		t.Fatalf("lease of MaxInt64 expires in %v, want about 100 years", d)
	}
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: math.MaxInt64}); err != nil {
		t.Fatal(err)
	}
	rec, err := s.Get(ctx, "s", "k")
	if err != nil {
		t.Fatal(err)
	}
	if d := rec.ExpiresAt.Sub(rec.UpdatedAt); d != century {
		t.Fatalf("outcome TTL of MaxInt64 = %v, want %v", d, century)
	}
	if d := c.PTTL(ctx, redisstore.KeysFor(s, "s", "k")).Val(); d < century-time.Hour {
		t.Fatalf("native TTL %v, want about 100 years", d)
	}
}

// TestCloseLeavesTheClientsPipelinerAlone: go-redis keeps one AutoPipeliner
// per client, which every store on the client and the client's other users
// share, so closing one store must not close it.
func TestCloseLeavesTheClientsPipelinerAlone(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	closed := newTestStore(t, c, redisstore.Options{Prefix: testPrefix(t, c), AutoPipeline: true})
	open := newTestStore(t, c, redisstore.Options{Prefix: testPrefix(t, c), AutoPipeline: true})
	pipe, err := c.AutoPipeline()
	if err != nil {
		t.Fatal(err)
	}
	if err := closed.Close(); err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	res, err := open.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease on the store left open = %v, %v; want execute", res.Decision, err)
	}
	if err := open.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Minute}); err != nil {
		t.Fatalf("Complete on the store left open: %v", err)
	}
	if err := pipe.Ping(ctx).Err(); err != nil {
		t.Fatalf("the client's own AutoPipeliner after a store closed: %v", err)
	}
	if _, err := closed.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: "k2", LeaseDuration: time.Minute}); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("ClaimLease on the closed store: %v, want store.ErrClosed", err)
	}
}

// TestPauseByTheKeysTTL: a release's pause is judged by the key's native
// TTL, like a lease. A pause as long as the record's TTL holds the key back
// until the record is gone, after which it is a new key; a record released
// without a pause, as every release before pauses wrote it, holds nothing
// back.
func TestPauseByTheKeysTTL(t *testing.T) {
	t.Parallel()
	c := newClient(t, nil)
	s := newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)})
	ctx := t.Context()
	claim := func(key string, want store.Decision) store.ClaimResult {
		t.Helper()
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: time.Minute})
		if err != nil || res.Decision != want {
			t.Fatalf("ClaimLease(%s) = %v, %v; want %v", key, res.Decision, err, want)
		}
		return res
	}
	l := claim("whole", store.DecisionExecute).Claim
	if err := s.Release(ctx, l, store.Completion{Status: store.StatusRetryable, TTL: time.Minute, RetryAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
	redisstore.AdvanceClock(s, time.Minute-time.Second)
	if res := claim("whole", store.DecisionHeld); res.RetryIn <= 0 || res.RetryIn > time.Second {
		t.Fatalf("RetryIn a second before the record expires = %v", res.RetryIn)
	}
	redisstore.AdvanceClock(s, 2*time.Second)
	if l := claim("whole", store.DecisionExecute).Claim; l.Attempt != 1 {
		t.Fatalf("claim after the record expired = attempt %d, want 1", l.Attempt)
	}

	l = claim("none", store.DecisionExecute).Claim
	if err := s.Release(ctx, l, store.Completion{Status: store.StatusRetryable, TTL: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if v := c.Get(ctx, redisstore.KeysFor(s, "s", "none")).Val(); !strings.HasPrefix(v, fmt.Sprintf("1|r|%d|1|0|", l.Token)) {
		t.Fatalf("record released without a pause = %.40q, want a tail of 0 as before pauses", v)
	}
	if l := claim("none", store.DecisionExecute).Claim; l.Attempt != 2 {
		t.Fatalf("claim after a release without a pause = attempt %d, want 2", l.Attempt)
	}
}
