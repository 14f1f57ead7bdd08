package policy_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/oncemill/oncemill/policy"
)

var (
	errNotFound = errors.New("not found")
	errTimeout  = errors.New("timeout")
)

type validationError struct{ field string }

func (e *validationError) Error() string { return "invalid " + e.field }

func TestZeroPolicyIsTheDefaults(t *testing.T) {
	t.Parallel()
	var zero policy.Policy
	p := zero.WithDefaults()
	if p.SuccessTTL != 24*time.Hour || p.FailureTTL != time.Hour || p.LeaseDuration != 30*time.Second || p.Heartbeat != 10*time.Second {
		t.Fatalf("defaults %+v", p)
	}
	if p.HeldKey != policy.HeldKeyWait || p.HeldKeyTimeout != 5*time.Second || p.NackDelay != time.Second ||
		p.MissingKey != policy.MissingKeyReject || p.MaxAttempts != 5 || p.MaxResultBytes != 1<<20 || p.MaxPayloadBytes != 4<<20 {
		t.Fatalf("defaults %+v", p)
	}
	if p.AttemptDelay != 3*time.Second || p.MaxAttemptDelay != time.Minute || p.Exhausted != policy.ExhaustedKeep {
		t.Fatalf("attempt defaults %+v", p)
	}
	if p.FinishedKey != policy.FinishedKeyReplay || p.NeverCacheFailures {
		t.Fatalf("duplicate and failure defaults %+v", p)
	}
	// A first pause above the default cap raises the cap with it; a
	// negative one means no pause.
	if p := (policy.Policy{AttemptDelay: 2 * time.Minute}).WithDefaults(); p.MaxAttemptDelay != 2*time.Minute {
		t.Fatalf("AttemptDelay 2m: cap %v", p.MaxAttemptDelay)
	}
	if p := (policy.Policy{AttemptDelay: -1}).WithDefaults(); p.AttemptDelay != 0 {
		t.Fatalf("AttemptDelay -1: %v, want 0 (no pause)", p.AttemptDelay)
	}
	// A set field is kept, and the heartbeat follows the lease.
	p = policy.Policy{LeaseDuration: 3 * time.Second, NackDelay: -1}.WithDefaults()
	if p.Heartbeat != time.Second || p.NackDelay != 0 || p.SuccessTTL != 24*time.Hour {
		t.Fatalf("Lease 3s, NackDelay -1: %+v", p)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	p := policy.Policy{}
	p.CachedErrors = []error{errNotFound}
	p.RetryableErrors = []error{errTimeout}
	p.Classifier = func(err error) (policy.Class, bool) {
		var v *validationError
		if errors.As(err, &v) {
			return policy.ClassCached, true
		}
		return 0, false
	}
	cases := []struct {
		name string
		err  error
		want policy.Class
	}{
		{"unknown error is retryable", errors.New("boom"), policy.ClassRetryable},
		{"context canceled is retryable", context.Canceled, policy.ClassRetryable},
		{"deadline is retryable", fmt.Errorf("call: %w", context.DeadlineExceeded), policy.ClassRetryable},
		{"permanent marker", policy.Cached(errors.New("bad")), policy.ClassCached},
		{"permanent marker wrapped", fmt.Errorf("handler: %w", policy.Cached(errors.New("bad"))), policy.ClassCached},
		{"transient marker beats CachedErrors", policy.Retryable(errNotFound), policy.ClassRetryable},
		{"outermost marker wins", policy.Cached(policy.Retryable(errors.New("x"))), policy.ClassCached},
		{"outermost marker wins, other way", policy.Retryable(policy.Cached(errors.New("x"))), policy.ClassRetryable},
		{"CachedErrors by errors.Is", fmt.Errorf("lookup: %w", errNotFound), policy.ClassCached},
		{"RetryableErrors beat CachedErrors", errors.Join(errNotFound, errTimeout), policy.ClassRetryable},
		{"classifier by errors.As", fmt.Errorf("x: %w", &validationError{"amount"}), policy.ClassCached},
		{"classifier beats markers", policy.Retryable(&validationError{"amount"}), policy.ClassCached},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := p.Classify(tc.err); got != tc.want {
				t.Fatalf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestMarkersKeepTheErrorChain(t *testing.T) {
	t.Parallel()
	err := policy.Cached(fmt.Errorf("charge: %w", errNotFound))
	if !errors.Is(err, errNotFound) || err.Error() != "charge: not found" {
		t.Fatalf("marker hides the chain: %v", err)
	}
	if policy.Cached(nil) != nil || policy.Retryable(nil) != nil {
		t.Fatal("marking nil must stay nil")
	}
	var zero policy.Policy
	if !(zero.Classify(err) == policy.ClassCached) || (zero.Classify(errNotFound) == policy.ClassCached) {
		t.Fatal("Classify does not cache a marked error, or caches an unmarked one")
	}
}
