package postgres_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/receiver"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// Values that would break a statement built by string concatenation travel
// as parameters and come back unchanged.
func TestHostileValuesRoundTrip(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema})
	ctx := t.Context()

	hostile := []string{
		`'`, `''`, `"`, `\`, `\\'`, `'; DROP TABLE oncemill_records; --`,
		`$1`, `$$ $$`, `%_*`, "line\nbreak\ttab\r", `E'\x41'`, "ünïcødé 🚀",
		`") ; DELETE FROM pg_class; --`, `{"a":[1,2]}`, `NULL`, ` `,
	}
	for i, v := range hostile {
		scope, key, fp := "scope"+v, "key"+v, "fp"+v
		res, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: scope, Key: key, Fingerprint: fp, LeaseDuration: time.Minute})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("Begin(%q) = %v, %v", v, res.Decision, err)
		}
		if res.Claim.Scope != scope || res.Claim.Key != key {
			t.Fatalf("lease for (%q, %q), want (%q, %q)", res.Claim.Scope, res.Claim.Key, scope, key)
		}
		result := append([]byte(v), 0, '\'', 0xff)
		out := store.Completion{Status: store.StatusSucceeded, Result: result, TTL: time.Hour}
		if i%2 == 1 {
			out = store.Completion{Status: store.StatusCachedFailure, ErrorKind: store.ErrorKind("kind" + v), ErrorMessage: "msg" + v, TTL: time.Hour}
		}
		if err := s.Complete(ctx, res.Claim, out); err != nil {
			t.Fatalf("Complete(%q): %v", v, err)
		}
		rec, err := s.Get(ctx, scope, key)
		if err != nil {
			t.Fatalf("Get(%q): %v", v, err)
		}
		if rec.Scope != scope || rec.Key != key || rec.Fingerprint != fp || !bytes.Equal(rec.Result, out.Result) ||
			rec.ErrorKind != out.ErrorKind || rec.ErrorMessage != out.ErrorMessage {
			t.Fatalf("record of %q = %+v, want scope %q key %q fp %q outcome %+v", v, rec, scope, key, fp, out)
		}
		again, err := s.ClaimLease(ctx, store.LeaseRequest{Scope: scope, Key: key, Fingerprint: fp, LeaseDuration: time.Minute})
		if err != nil || again.Decision != store.DecisionReplay {
			t.Fatalf("second Begin(%q) = %v, %v; want replay", v, again.Decision, err)
		}
		if err := s.Delete(ctx, scope, key, rec.Token); err != nil {
			t.Fatalf("Delete(%q): %v", v, err)
		}
		if _, err := s.Get(ctx, scope, key); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("Get after Delete(%q) = %v", v, err)
		}
	}
	// Nothing else was touched: the table holds no other row and still exists.
	var n int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+table(schema, "")).Scan(&n); err != nil || n != 0 {
		t.Fatalf("table holds %d rows (%v), want 0", n, err)
	}
}

// PostgreSQL text cannot hold NUL and requires UTF-8: such scopes, keys and
// fingerprints are refused up front with a clear error, before they could
// fail a statement shared with other requests.
func TestUnstorableTextRefused(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := newStore(t, pool, postgres.Options{})
	ctx := t.Context()

	cases := []struct {
		name string
		req  store.LeaseRequest
		want string
	}{
		{"NUL in key", store.LeaseRequest{Key: "a\x00b", LeaseDuration: time.Minute}, "key contains a NUL byte"},
		{"NUL in scope", store.LeaseRequest{Scope: "\x00", Key: "k", LeaseDuration: time.Minute}, "scope contains a NUL byte"},
		{"NUL in fingerprint", store.LeaseRequest{Key: "k", Fingerprint: "f\x00", LeaseDuration: time.Minute}, "fingerprint contains a NUL byte"},
		{"invalid UTF-8 key", store.LeaseRequest{Key: "k\xff\xfe", LeaseDuration: time.Minute}, "key is not valid UTF-8"},
		{"key over MaxKeyLen", store.LeaseRequest{Key: strings.Repeat("k", 513), LeaseDuration: time.Minute}, "longer than MaxKeyLen 512"},
		{"scope over its limit", store.LeaseRequest{Scope: strings.Repeat("s", store.MaxScopeLen+1), Key: "k", LeaseDuration: time.Minute}, "scope is 1025 bytes"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			_, err := s.ClaimLease(ctx, c.req)
			if !errors.Is(err, store.ErrInvalidRequest) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("ClaimLease = %v, want ErrInvalidRequest saying %q", err, c.want)
			}
		})
	}

	// A bad request in the same moment as good ones fails alone.
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "good", LeaseDuration: time.Minute})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("Begin(good) = %v, %v", res.Decision, err)
	}

	// Get, Delete and the lease operations check keys the same way.
	bad := store.Claim{Key: "x\x00", Token: 1}
	for op, err := range map[string]error{
		"Complete": s.Complete(ctx, bad, store.Completion{Status: store.StatusSucceeded, TTL: time.Minute}),
		"Release":  s.Release(ctx, bad, store.Completion{Status: store.StatusRetryable, TTL: time.Minute}),
		"Delete":   s.Delete(ctx, "", "x\x00", 1),
	} {
		if !errors.Is(err, store.ErrInvalidRequest) {
			t.Errorf("%s with a NUL key = %v, want ErrInvalidRequest", op, err)
		}
	}
	if _, err := s.Get(ctx, "", "x\x00"); !errors.Is(err, store.ErrInvalidRequest) {
		t.Errorf("Get with a NUL key = %v, want ErrInvalidRequest", err)
	}
	if _, err := s.Extend(ctx, bad, time.Minute); !errors.Is(err, store.ErrInvalidRequest) {
		t.Errorf("Extend with a NUL key = %v, want ErrInvalidRequest", err)
	}
}

// Error texts describe a failure that must be recorded, so they are made
// storable rather than refused: NUL and invalid UTF-8 become U+FFFD, and an
// overlong message is cut at a character boundary.
func TestErrorTextMadeStorable(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := newStore(t, pool, postgres.Options{})
	ctx := t.Context()
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "k", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", postgres.MaxErrorMessageLen) // 2 bytes each
	if err := s.Complete(ctx, res.Claim, store.Completion{
		Status: store.StatusCachedFailure, ErrorKind: "bad\x00kind", ErrorMessage: "a\x00b\xffc" + long, TTL: time.Hour,
	}); err != nil {
		t.Fatalf("Complete with NUL in the error: %v", err)
	}
	rec, err := s.Get(ctx, "", "k")
	if err != nil {
		t.Fatal(err)
	}
	if rec.ErrorKind != "bad\uFFFDkind" {
		t.Errorf("ErrorKind = %q", rec.ErrorKind)
	}
	if !strings.HasPrefix(rec.ErrorMessage, "a\uFFFDb\uFFFDc") || len(rec.ErrorMessage) > postgres.MaxErrorMessageLen {
		t.Errorf("ErrorMessage starts %q and is %d bytes, want the replacement characters and at most %d", rec.ErrorMessage[:12], len(rec.ErrorMessage), postgres.MaxErrorMessageLen)
	}
	if !strings.HasSuffix(rec.ErrorMessage, "é") {
		t.Errorf("ErrorMessage was cut inside a character")
	}
}

func TestResultSizeBounded(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := newStore(t, pool, postgres.Options{MaxResultBytes: 1000})
	ctx := t.Context()
	res, err := s.ClaimLease(ctx, store.LeaseRequest{Key: "k", LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: make([]byte, 1001), TTL: time.Hour})
	if !errors.Is(err, store.ErrInvalidRequest) || !strings.Contains(err.Error(), "result is 1001 bytes, more than MaxResultBytes 1000") {
		t.Fatalf("Complete with 1001 bytes = %v, want ErrInvalidRequest naming the limit", err)
	}
	// Refused without touching the lease: the exact limit still fits.
	if err := s.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, Result: make([]byte, 1000), TTL: time.Hour}); err != nil {
		t.Fatalf("Complete with 1000 bytes: %v", err)
	}
}

// The length limits apply where records are created: a store with a smaller
// MaxKeyLen still reads, finishes and deletes records made under a larger
// one.
func TestLimitsApplyToNewRecords(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	wide := newStore(t, pool, postgres.Options{Schema: schema, MaxKeyLen: 1024})
	narrow := newStore(t, pool, postgres.Options{Schema: schema, MaxKeyLen: 16})
	ctx := t.Context()
	key := strings.Repeat("k", 800)
	res, err := wide.ClaimLease(ctx, store.LeaseRequest{Key: key, LeaseDuration: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := narrow.ClaimLease(ctx, store.LeaseRequest{Key: key, LeaseDuration: time.Minute}); !errors.Is(err, store.ErrInvalidRequest) {
		t.Fatalf("ClaimLease of an 800-byte key with MaxKeyLen 16 = %v, want ErrInvalidRequest", err)
	}
	if _, err := narrow.Extend(ctx, res.Claim, time.Minute); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if err := narrow.Complete(ctx, res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: time.Hour}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	if _, err := narrow.Get(ctx, "", key); err != nil {
		t.Fatalf("Get: %v", err)
	}
	if err := narrow.Delete(ctx, "", key, res.Claim.Token); err != nil {
		t.Fatalf("Delete: %v", err)
	}
}

// A key PostgreSQL text cannot hold (a NUL byte, invalid UTF-8) is hashed
// before it reaches the store, in both modes: the message runs once and its
// duplicate replays, as on every other store; nothing is nacked forever.
func TestUnstorableKeysAreHashedNotRefused(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := newStore(t, pool, postgres.Options{})
	for _, mode := range []struct {
		name  string
		build *receiver.Builder
	}{
		{"lease", receiver.New(s)},
		{"one-transaction", receiver.NewTransactional(s)},
	} {
		for _, key := range []string{"order\x0042", "order-\xff\xfe"} {
			var outcomes []pipeline.Outcome
			r, err := mode.build.WithScope(mode.name).WithEventHandler(func(e pipeline.Event) { outcomes = append(outcomes, e.Outcome) }).Build()
			if err != nil {
				t.Fatal(err)
			}
			var runs int
			h := r.Middleware(func(*message.Message) ([]*message.Message, error) { runs++; return nil, nil })
			for range 2 {
				if _, err := h(message.NewMessage(key, []byte("x"))); err != nil {
					t.Fatalf("%s, key %q: delivery = %v, want an ack", mode.name, key, err)
				}
			}
			if runs != 1 || len(outcomes) != 2 || outcomes[0] != pipeline.OutcomeExecuted || outcomes[1] != pipeline.OutcomeReplayed {
				t.Fatalf("%s, key %q: %d runs, outcomes %v; want one run, executed then replayed", mode.name, key, runs, outcomes)
			}
			if _, err := s.Get(t.Context(), mode.name, keygen.StorableKey(key, s.Limits().MaxKeyLen)); err != nil {
				t.Fatalf("%s, key %q: the record is not under the hashed key: %v", mode.name, key, err)
			}
		}
	}
}

// A policy result limit above the store's is refused at Build; under it, a
// success whose produced messages exceed the policy is stored without them,
// in both modes: the handler runs once and its duplicate is acked.
func TestResultLimitsAgreeWithTheStore(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	s := newStore(t, pool, postgres.Options{})
	for _, b := range []*receiver.Builder{receiver.New(s), receiver.NewTransactional(s)} {
		if _, err := b.WithPolicy(policy.Policy{MaxResultBytes: 8 << 20}).Build(); !errors.Is(err, oncemill.ErrInvalidConfig) || !strings.Contains(err.Error(), "above the store's limit") {
			t.Fatalf("Build with a result limit above the store's = %v, want ErrInvalidConfig", err)
		}
	}
	big := bytes.Repeat([]byte("x"), 2<<20)
	for _, mode := range []struct {
		name  string
		build *receiver.Builder
	}{
		{"lease", receiver.New(s)},
		{"one-transaction", receiver.NewTransactional(s)},
	} {
		r, err := mode.build.WithScope("big-" + mode.name).Build()
		if err != nil {
			t.Fatal(err)
		}
		runs := 0
		h := r.Middleware(func(*message.Message) ([]*message.Message, error) {
			runs++
			return []*message.Message{message.NewMessage("out", big)}, nil
		})
		out, err := h(message.NewMessage("m1", []byte("x")))
		if err != nil || len(out) != 1 {
			t.Fatalf("%s: first delivery = %d messages, %v; want the produced message, acked", mode.name, len(out), err)
		}
		out, err = h(message.NewMessage("m1", []byte("x")))
		if err != nil || len(out) != 0 || runs != 1 {
			t.Fatalf("%s: duplicate = %d messages, %v, %d runs; want an ack without the omitted messages and one run", mode.name, len(out), err, runs)
		}
	}
}
