package idempotency_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/pipeline"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

// tenantScope scopes a message by its "tenant" metadata.
func tenantScope(m *message.Message) (string, error) { return m.Metadata.Get("tenant"), nil }

func tenantMsg(uuid, tenant string) *message.Message {
	m := msg(uuid, "x")
	m.Metadata.Set("tenant", tenant)
	return m
}

// One stage serves two tenants whose keys collide: the same key runs once
// for each tenant, and each tenant's duplicate is replayed from its own
// record.
func TestScopeFuncRunsEachTenantsKeyOnce(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) { c.Scope, c.ScopeFunc = "", tenantScope })
	var calls atomic.Int32
	handler := h.stage.Middleware(produce(&calls))
	for _, m := range []*message.Message{
		tenantMsg("order-1", "acme"), tenantMsg("order-1", "globex"),
		tenantMsg("order-1", "acme"), tenantMsg("order-1", "globex"),
	} {
		if _, err := handler(m); err != nil {
			t.Fatal(err)
		}
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("handler ran %d times, want 2: once per tenant", n)
	}
	h.mu.Lock()
	events := h.events
	h.mu.Unlock()
	want := []struct {
		scope   string
		outcome pipeline.Outcome
	}{
		{"acme", pipeline.OutcomeExecuted}, {"globex", pipeline.OutcomeExecuted},
		{"acme", pipeline.OutcomeReplayed}, {"globex", pipeline.OutcomeReplayed},
	}
	for i, w := range want {
		if e := events[i]; e.Scope != w.scope || e.Key != "order-1" || e.Outcome != w.outcome {
			t.Errorf("delivery %d: scope %q key %q outcome %v, want %q order-1 %v", i, e.Scope, e.Key, e.Outcome, w.scope, w.outcome)
		}
	}
	for _, tenant := range []string{"acme", "globex"} {
		if rec, err := h.store.Get(context.Background(), tenant, "order-1"); err != nil || rec.Status != store.StatusSucceeded {
			t.Errorf("record of %s/order-1: %+v, %v; want a success", tenant, rec, err)
		}
	}
}

// A scope no store can hold (longer than store.MaxScopeLen, a NUL byte,
// invalid UTF-8) is hashed as a key is, and two long scopes that share a
// prefix stay apart.
func TestScopeFuncHashesAScopeNoStoreHolds(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(c *stageConfig) { c.Scope, c.ScopeFunc = "", tenantScope })
	var calls atomic.Int32
	handler := h.stage.Middleware(produce(&calls))
	long := strings.Repeat("t", store.MaxScopeLen)
	for _, tenant := range []string{long + "1", long + "2", "nul\x00tenant", "bad\xffutf8", long} {
		for range 2 {
			if _, err := handler(tenantMsg("order-1", tenant)); err != nil {
				t.Fatal(err)
			}
		}
		want := keygen.StorableKey(tenant, store.MaxScopeLen)
		if tenant != long && (want == tenant || !strings.HasPrefix(want, "hashed:sha256:")) {
			t.Fatalf("keygen.StorableKey(%.20q) = %.20q, want a hash", tenant, want)
		}
		if e := h.last(); e.Scope != want || e.Outcome != pipeline.OutcomeReplayed {
			t.Errorf("tenant %.20q: scope %.30q, outcome %v; want %.30q, replayed", tenant, e.Scope, e.Outcome, want)
		}
		if _, err := h.store.Get(context.Background(), want, "order-1"); err != nil {
			t.Errorf("tenant %.20q: no record under %.30q: %v", tenant, want, err)
		}
	}
	if n := calls.Load(); n != 5 {
		t.Fatalf("handler ran %d times, want 5: once per tenant (a scope of exactly MaxScopeLen bytes is kept as it is)", n)
	}
}

// A scope function's error is a key generator's: an error the policy caches
// rejects the message, any other nacks it; an empty scope, like an empty
// key, is a message without a key, handled as policy.MissingKey says.
func TestScopeFuncErrors(t *testing.T) {
	t.Parallel()
	errLookup := errors.New("tenant directory down")
	for _, tc := range []struct {
		name    string
		scope   func(*message.Message) (string, error)
		missing policy.MissingKeyMode
		outcome pipeline.Outcome
		nacked  bool
		ran     bool
		is      error
	}{
		{"retryable error", func(*message.Message) (string, error) { return "", errLookup }, 0, pipeline.OutcomeKeyFailed, true, false, errLookup},
		{"cached error", func(*message.Message) (string, error) { return "", policy.Cached(errLookup) }, 0, pipeline.OutcomeRejected, false, false, errLookup},
		{"no key", func(*message.Message) (string, error) { return "", keygen.ErrMissingMetadata }, 0, pipeline.OutcomeRejected, false, false, keygen.ErrNoKey},
		{"empty scope", func(*message.Message) (string, error) { return "", nil }, 0, pipeline.OutcomeRejected, false, false, keygen.ErrNoKey},
		{"empty scope, run unguarded", func(*message.Message) (string, error) { return "", nil }, policy.MissingKeyRunUnguarded, pipeline.OutcomeUnguarded, false, true, keygen.ErrNoKey},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, func(c *stageConfig) {
				c.Scope, c.ScopeFunc, c.Policy.MissingKey = "", tc.scope, tc.missing
				c.Logger = slog.New(slog.DiscardHandler)
			})
			var calls atomic.Int32
			_, err := h.stage.Middleware(produce(&calls))(msg("m1", "x"))
			if (err != nil) != tc.nacked {
				t.Fatalf("returned %v, want nacked %v", err, tc.nacked)
			}
			e := h.last()
			if e.Outcome != tc.outcome || !errors.Is(e.Err, tc.is) || (calls.Load() == 1) != tc.ran {
				t.Fatalf("outcome %v, error %v, handler ran %d; want %v, an error wrapping %v, ran %v", e.Outcome, e.Err, calls.Load(), tc.outcome, tc.is, tc.ran)
			}
			if tc.nacked && !strings.Contains(err.Error(), "the scope function failed") {
				t.Errorf("error %q does not name the scope function", err)
			}
		})
	}
}

// A scope is fixed or computed, not both.
func TestScopeAndScopeFuncAreExclusive(t *testing.T) {
	t.Parallel()
	st := newFakeTxStore()
	defer st.Close()
	_, err := idempotency.NewLeased(st, idempotency.Config{Scope: "orders", ScopeFunc: tenantScope})
	var ce *oncemill.ConfigError
	if !errors.As(err, &ce) || ce.Setting != "WithScope and WithScopeFunc" || !strings.Contains(ce.Problem, "keep one") {
		t.Fatalf("NewLeased with Scope and ScopeFunc: %v; want a ConfigError naming both", err)
	}
}
