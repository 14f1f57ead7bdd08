package redisstore_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/redisstore"
)

// TestContractValkey runs the contract suite on a server with SET IFEQ
// (Valkey 8.1, scripts/valkey), where a lease is finished by one
// compare-and-set of the value it wrote, with and without AutoPipeline.
func TestContractValkey(t *testing.T) {
	t.Parallel()
	c := newValkeyClient(t, &redis.Options{PoolSize: 4})
	for _, autoPipeline := range []bool{false, true} {
		name := "direct"
		if autoPipeline {
			name = "autopipeline"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			runContract(t, c, autoPipeline)
		})
	}
}

// sent counts the commands a client sends, by name ("set ifeq" for a SET
// with IFEQ, "finish script" and the like for a script call: its EVALSHA,
// not the EVAL that follows when the server's script cache is cold): what
// the tests expect of the store, whoever else uses the server.
type sent struct {
	mu     sync.Mutex
	counts map[string]int
}

// countingStore returns a store over c, and what counts the commands c sends.
func countingStore(t *testing.T, c *redis.Client) (*redisstore.Store, *sent) {
	t.Helper()
	h := &sent{counts: map[string]int{}}
	c.AddHook(h)
	return newStore(t, c, redisstore.Options{Prefix: testPrefix(t, c)}), h
}

func (h *sent) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *sent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.count(cmd)
		return next(ctx, cmd)
	}
}

func (h *sent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			h.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (h *sent) count(cmd redis.Cmder) {
	name := cmd.Name()
	switch {
	case name == "set" && slices.Contains(cmd.Args(), any("ifeq")):
		name = "set ifeq"
	case name == "evalsha":
		sha, _ := cmd.Args()[1].(string)
		if name = redisstore.ScriptName(sha); name == "" {
			name = "unknown script"
		}
	case name == "eval":
		return // the same script again, the server's cache being cold
	}
	h.mu.Lock()
	h.counts[name]++
	h.mu.Unlock()
}

// during returns what the client sent while f ran.
func (h *sent) during(f func()) map[string]int {
	h.mu.Lock()
	clear(h.counts)
	h.mu.Unlock()
	f()
	h.mu.Lock()
	defer h.mu.Unlock()
	return maps.Clone(h.counts)
}

// begin begins key and returns its lease.
func begin(t *testing.T, s *redisstore.Store, key string) store.Claim {
	t.Helper()
	res, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: key, Fingerprint: "fp", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("Begin(%s) = %v, %v; want execute", key, res.Decision, err)
	}
	return res.Claim
}

// TestFinishIsOneSetIfEq: on a server with SET IFEQ, Complete and Release
// (keeping a record) are one SET each, with no script, and leave the record
// they should.
func TestFinishIsOneSetIfEq(t *testing.T) {
	t.Parallel()
	s, cmds := countingStore(t, newValkeyClient(t, nil))
	ctx := t.Context()
	for _, tt := range []struct {
		finish string
		call   func(l store.Claim) error
		want   store.Status
	}{
		{"complete", func(l store.Claim) error {
			return s.Complete(ctx, l, store.Completion{Status: store.StatusSucceeded, Result: []byte("r"), TTL: time.Hour})
		}, store.StatusSucceeded},
		{"release", func(l store.Claim) error {
			return s.Release(ctx, l, store.Completion{Status: store.StatusRetryable, TTL: time.Hour})
		}, store.StatusRetryable},
		// A pause and an attempt given back are in the value the worker
		// writes: still one SET.
		{"paused release", func(l store.Claim) error {
			return s.Release(ctx, l, store.Completion{Status: store.StatusRetryable, TTL: time.Hour, RetryAfter: time.Minute, Uncounted: true})
		}, store.StatusRetryable},
	} {
		l := begin(t, s, tt.finish)
		var err error
		got := cmds.during(func() { err = tt.call(l) })
		if err != nil {
			t.Fatalf("%s: %v", tt.finish, err)
		}
		if want := map[string]int{"set ifeq": 1}; !maps.Equal(got, want) {
			t.Errorf("%s sent %v, want %v", tt.finish, got, want)
		}
		rec, err := s.Get(ctx, "s", tt.finish)
		if err != nil || rec.Status != tt.want || rec.Fingerprint != "fp" {
			t.Errorf("after %s: %v %q %v, want %v with fingerprint fp", tt.finish, rec.Status, rec.Fingerprint, err, tt.want)
		}
		if paused := tt.finish == "paused release"; paused != !rec.RetryAt.IsZero() || paused && rec.Attempt != 0 {
			t.Errorf("after %s: attempt %d, RetryAt %v", tt.finish, rec.Attempt, rec.RetryAt)
		}
	}
	if redisstore.SetIfEqRefused(s) {
		t.Error("the store thinks Valkey refused SET IFEQ")
	}
}

// finishCommands are what the store sends to finish a lease by
// compare-and-set, on Valkey and on Redis 7.0.
var finishCommands = []struct {
	server string
	client func(testing.TB, *redis.Options) *redis.Client
	cas    string
}{
	{"valkey", newValkeyClient, "set ifeq"},
	{"redis7", newClient, "setIfEq script"},
}

// TestFinishAfterExtend: an Extend rewrites the value a lease wrote, so the
// lease ClaimLease returned no longer matches it. Its Complete misses the
// compare-and-set and the finish script finishes it: one round trip more,
// the same answer. The lease Extend returns goes to the finish script at
// once, and a lease lost to a takeover misses too and is refused. On Redis
// 7.0 the compare-and-set is setIfEqScript, once the store has learned that
// the server has no SET IFEQ.
func TestFinishAfterExtend(t *testing.T) {
	t.Parallel()
	for _, server := range finishCommands {
		t.Run(server.server, func(t *testing.T) {
			t.Parallel()
			s, cmds := countingStore(t, server.client(t, nil))
			ctx := t.Context()
			if err := s.Complete(ctx, begin(t, s, "first"), store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
				t.Fatal(err) // on Redis 7.0, learns that there is no SET IFEQ
			}
			for _, useExtended := range []bool{false, true} {
				key := "begun"
				if useExtended {
					key = "extended"
				}
				l := begin(t, s, key)
				extended, err := s.Extend(ctx, l, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				if extended.Version != "" {
					t.Errorf("Extend returned a lease with Version %q, want none: the value changed", extended.Version)
				}
				want := map[string]int{server.cas: 1, "finish script": 1}
				if useExtended {
					l, want = extended, map[string]int{"finish script": 1}
				}
				got := cmds.during(func() { err = s.Complete(ctx, l, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}) })
				if err != nil {
					t.Fatalf("Complete(%s): %v", key, err)
				}
				if !maps.Equal(got, want) {
					t.Errorf("Complete(%s) sent %v, want %v", key, got, want)
				}
				if rec, err := s.Get(ctx, "s", key); err != nil || rec.Status != store.StatusSucceeded {
					t.Errorf("%s after Complete: %v %v, want succeeded", key, rec.Status, err)
				}
			}

			stale := begin(t, s, "taken")
			redisstore.AdvanceClock(s, 2*time.Minute+time.Second) // past the lease and its tail
			newer := begin(t, s, "taken")
			var err error
			got := cmds.during(func() { err = s.Complete(ctx, stale, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}) })
			if !errors.Is(err, store.ErrLeaseLost) {
				t.Fatalf("Complete of a lease taken over: %v, want ErrLeaseLost", err)
			}
			if want := map[string]int{server.cas: 1, "finish script": 1}; !maps.Equal(got, want) {
				t.Errorf("Complete of a lease taken over sent %v, want %v", got, want)
			}
			if rec, err := s.Get(ctx, "s", "taken"); err != nil || rec.Status != store.StatusInProgress || rec.Token != newer.Token {
				t.Fatalf("after the stale Complete: %v token %d %v, want in progress under token %d", rec.Status, rec.Token, err, newer.Token)
			}
		})
	}
}

// TestSetIfEqRefused: Redis 7.0 has no SET IFEQ. The first Complete learns
// that from its syntax error and sends setIfEqScript, the same
// compare-and-set of the whole value in one script; later ones and Release
// (keeping a record) send that script alone, and no SET IFEQ.
func TestSetIfEqRefused(t *testing.T) {
	t.Parallel()
	s, cmds := countingStore(t, newClient(t, nil))
	ctx := t.Context()
	complete := func(l store.Claim) error {
		return s.Complete(ctx, l, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour})
	}
	for i, tt := range []struct {
		key  string
		call func(l store.Claim) error
		want store.Status
	}{
		{"first", complete, store.StatusSucceeded},
		{"second", complete, store.StatusSucceeded},
		{"released", func(l store.Claim) error {
			return s.Release(ctx, l, store.Completion{Status: store.StatusRetryable, TTL: time.Hour})
		}, store.StatusRetryable},
	} {
		l := begin(t, s, tt.key)
		var err error
		got := cmds.during(func() { err = tt.call(l) })
		if err != nil {
			t.Fatalf("finishing %s on Redis 7: %v", tt.key, err)
		}
		want := map[string]int{"setIfEq script": 1}
		if i == 0 {
			want = map[string]int{"set ifeq": 1, "setIfEq script": 1}
		}
		if !maps.Equal(got, want) {
			t.Errorf("finishing %s sent %v, want %v", tt.key, got, want)
		}
		if rec, err := s.Get(ctx, "s", tt.key); err != nil || rec.Status != tt.want || rec.Fingerprint != "fp" {
			t.Fatalf("%s after finishing: %v %q %v, want %v with fingerprint fp", tt.key, rec.Status, rec.Fingerprint, err, tt.want)
		}
		if !redisstore.SetIfEqRefused(s) {
			t.Fatalf("after finishing %s the store still tries SET IFEQ", tt.key)
		}
	}
}
