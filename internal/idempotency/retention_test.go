package idempotency_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/attribute"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/internal/teltest"
	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store"
)

const week = 7 * 24 * time.Hour

// One stage on one router, three handlers: payments keeps its successes a
// week (its failures the policy's hour), notifications keeps both shorter,
// and audit, not named, keeps the policy's. Each record expires by its
// handler's TTL, and the delivery span carries it.
func TestRetentionForPerHandlerThroughRouter(t *testing.T) {
	t.Parallel()
	k := newTelKit(t)
	h := newHarness(t, func(c *stageConfig) {
		c.Scope = "" // the handler name: each handler's records are its own
		k.use(&c.Config)
		c.RetentionFor = map[string]idempotency.Retention{
			"payments":      {SuccessTTL: week},
			"notifications": {SuccessTTL: time.Hour, FailureTTL: 10 * time.Minute},
		}
	})
	rr := newRouterRun(t)
	var busy atomic.Bool
	handle := func(m *message.Message) error {
		switch {
		case string(m.Payload) == "decline":
			return policy.Cached(errDeclined)
		case string(m.Payload) == "busy" && busy.CompareAndSwap(false, true):
			return errors.New("mail server busy") // released, then redelivered
		}
		return nil
	}
	for _, name := range []string{"payments", "notifications", "audit"} {
		rr.router.AddConsumerHandler(name, name+".in", rr.pubSub, handle).AddMiddleware(h.stage.Middleware)
	}
	rr.start()
	for _, name := range []string{"payments", "notifications", "audit"} {
		rr.publish(name+".in", msg(name+"-ok", "x"), msg(name+"-declined", "decline"))
	}
	rr.publish("notifications.in", msg("notifications-busy", "busy"))
	rr.waitAcks(7)

	// The released key kept its attempt count for the handler's failure
	// TTL; its redelivery then stored the success for the success TTL.
	var busyTTLs []float64
	for _, s := range k.Named("process notifications.in") {
		if attrs := teltest.SpanAttrs(s); attrs["idempotency.key"].AsString() == "notifications-busy" {
			busyTTLs = append(busyTTLs, attrs["idempotency.ttl_seconds"].AsFloat64())
		}
	}
	if !slices.Equal(busyTTLs, []float64{600, 3600}) {
		t.Errorf("notifications-busy: idempotency.ttl_seconds %v, want 600 (released) then 3600 (executed)", busyTTLs)
	}

	for _, w := range []struct {
		handler, key string
		status       store.Status
		ttl          time.Duration
	}{
		{"payments", "payments-ok", store.StatusSucceeded, week},
		{"payments", "payments-declined", store.StatusCachedFailure, time.Hour}, // the policy's
		{"notifications", "notifications-ok", store.StatusSucceeded, time.Hour},
		{"notifications", "notifications-declined", store.StatusCachedFailure, 10 * time.Minute},
		{"audit", "audit-ok", store.StatusSucceeded, 24 * time.Hour},
		{"audit", "audit-declined", store.StatusCachedFailure, time.Hour},
	} {
		rec, err := h.store.Get(context.Background(), w.handler, w.key)
		if err != nil {
			t.Fatalf("%s/%s: %v", w.handler, w.key, err)
		}
		if got := rec.ExpiresAt.Sub(h.clock.Now()); rec.Status != w.status || got != w.ttl {
			t.Errorf("%s/%s: %v expiring in %v, want %v in %v", w.handler, w.key, rec.Status, got, w.status, w.ttl)
		}
		var span attribute.Value
		for _, s := range k.Named("process " + w.handler + ".in") {
			if attrs := teltest.SpanAttrs(s); attrs["idempotency.key"].AsString() == w.key {
				span = attrs["idempotency.ttl_seconds"]
			}
		}
		if span.Type() != attribute.FLOAT64 || span.AsFloat64() != w.ttl.Seconds() {
			t.Errorf("%s/%s: idempotency.ttl_seconds %v, want %v", w.handler, w.key, span.Emit(), w.ttl.Seconds())
		}
	}
}

// The one-transaction mode claims with the handler's success TTL, keeps the
// record at least for the longer of its two TTLs, and records a rolled-back
// attempt for its failure TTL.
func TestRetentionForInTheOneTransactionMode(t *testing.T) {
	t.Parallel()
	st := &txRequests{fakeTxStore: newFakeTxStore(), claims: map[string]store.TxRequest{}, records: map[string]time.Duration{}}
	defer st.Close()
	stage, err := idempotency.NewTransactional(st, idempotency.Config{
		Policy:       txPolicy(),
		RetentionFor: map[string]idempotency.Retention{"payments": {SuccessTTL: week}, "notifications": {FailureTTL: 48 * time.Hour}},
	})
	if err != nil {
		t.Fatal(err)
	}
	rr := newRouterRun(t)
	var failed atomic.Bool
	handle := func(m *message.Message) error {
		if m.UUID == "notifications-1" && failed.CompareAndSwap(false, true) {
			return errors.New("mail server busy") // retryable: rolled back, recorded, redelivered
		}
		return nil
	}
	for _, name := range []string{"payments", "notifications", "audit"} {
		rr.router.AddConsumerHandler(name, name+".in", rr.pubSub, handle).AddMiddleware(stage.Middleware)
	}
	rr.start()
	for _, name := range []string{"payments", "notifications", "audit"} {
		rr.publish(name+".in", msg(name+"-1", "x"))
	}
	rr.waitAcks(3)

	st.mu.Lock()
	defer st.mu.Unlock()
	for _, w := range []struct {
		key                string
		successTTL, retain time.Duration
	}{
		{"payments-1", week, week},
		{"notifications-1", 24 * time.Hour, 48 * time.Hour},
		{"audit-1", 24 * time.Hour, 24 * time.Hour},
	} {
		if r := st.claims[w.key]; r.SuccessTTL != w.successTTL || r.Retain != w.retain {
			t.Errorf("%s: claimed with SuccessTTL %v Retain %v, want %v and %v", w.key, r.SuccessTTL, r.Retain, w.successTTL, w.retain)
		}
	}
	if ttl, ok := st.records["notifications-1"]; !ok || ttl != 48*time.Hour || len(st.records) != 1 {
		t.Errorf("rolled-back attempts recorded %v, want notifications-1 for 48h", st.records)
	}
}

// txRequests keeps each key's last claim request and rolled-back record TTL.
type txRequests struct {
	*fakeTxStore
	mu      sync.Mutex
	claims  map[string]store.TxRequest
	records map[string]time.Duration
}

func (s *txRequests) ClaimInTx(ctx context.Context, req store.TxRequest) (store.TxResult, error) {
	s.mu.Lock()
	s.claims[req.Key] = req
	s.mu.Unlock()
	return s.fakeTxStore.ClaimInTx(ctx, req)
}

func (s *txRequests) RecordRollback(ctx context.Context, l store.Claim, fp string, out store.Completion) error {
	s.mu.Lock()
	s.records[l.Key] = out.TTL
	s.mu.Unlock()
	return s.fakeTxStore.RecordRollback(ctx, l, fp, out)
}

// Each override names a handler and a TTL to change; neither may be negative.
func TestRetentionForRefused(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		r    map[string]idempotency.Retention
		says string
	}{
		{"no handler name", map[string]idempotency.Retention{"": {SuccessTTL: time.Hour}}, "handler name is empty"},
		{"negative success TTL", map[string]idempotency.Retention{"payments": {SuccessTTL: -time.Hour}}, "must be positive"},
		{"negative failure TTL", map[string]idempotency.Retention{"payments": {FailureTTL: -time.Hour}}, "must be positive"},
		{"nothing to change", map[string]idempotency.Retention{"payments": {}}, "both TTLs are 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st := newFakeTxStore()
			defer st.Close()
			_, err := idempotency.NewLeased(st, idempotency.Config{KeyGenerator: keygen.UUID(), RetentionFor: tc.r})
			var ce *oncemill.ConfigError
			if !errors.As(err, &ce) || ce.Setting != "WithRetentionFor" || !strings.Contains(ce.Problem, tc.says) {
				t.Fatalf("NewLeased: %v; want a ConfigError for WithRetentionFor saying %q", err, tc.says)
			}
		})
	}
}
