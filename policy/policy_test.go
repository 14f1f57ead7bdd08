package policy_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
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

func TestDefaultIsValidAndMatchesTheDesign(t *testing.T) {
	p := policy.Default()
	if err := p.Validate(); err != nil {
		t.Fatal(err)
	}
	if p.SuccessTTL != 24*time.Hour || p.FailureTTL != time.Hour || p.Lease != 30*time.Second || p.Heartbeat >= p.Lease {
		t.Fatalf("defaults %+v", p)
	}
	if p.InProgress != policy.Wait || p.MissingKey != policy.FailMissingKey || p.MaxAttempts < 1 {
		t.Fatalf("defaults %+v", p)
	}
}

func TestValidateSaysWhatToChange(t *testing.T) {
	cases := map[string]struct {
		mutate func(*policy.Policy)
		says   string
	}{
		"success ttl":      {func(p *policy.Policy) { p.SuccessTTL = 0 }, "SuccessTTL"},
		"failure ttl":      {func(p *policy.Policy) { p.FailureTTL = -1 }, "FailureTTL"},
		"lease":            {func(p *policy.Policy) { p.Lease = 0 }, "Lease is 0s"},
		"heartbeat zero":   {func(p *policy.Policy) { p.Heartbeat = 0 }, "Heartbeat is 0s"},
		"heartbeat long":   {func(p *policy.Policy) { p.Heartbeat = p.Lease }, "not shorter than Lease"},
		"attempts":         {func(p *policy.Policy) { p.MaxAttempts = 0 }, "MaxAttempts"},
		"in-progress mode": {func(p *policy.Policy) { p.InProgress = 5 }, "policy.Wait"},
		"wait bound":       {func(p *policy.Policy) { p.InProgressWait = 0 }, "InProgressWait"},
		"nack delay":       {func(p *policy.Policy) { p.NackDelay = -time.Second }, "NackDelay"},
		"missing key":      {func(p *policy.Policy) { p.MissingKey = 3 }, "policy.FailMissingKey"},
		"result size":      {func(p *policy.Policy) { p.MaxResultBytes = 0 }, "MaxResultBytes"},
		"payload size":     {func(p *policy.Policy) { p.MaxPayloadBytes = -1 }, "MaxPayloadBytes"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := policy.Default()
			tc.mutate(&p)
			err := p.Validate()
			if !errors.Is(err, policy.ErrInvalid) || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want ErrInvalid saying %q", err, tc.says)
			}
		})
	}
	// Nack mode needs no wait bound.
	p := policy.Default()
	p.InProgress, p.InProgressWait = policy.Nack, 0
	if err := p.Validate(); err != nil {
		t.Fatalf("nack mode without a wait bound: %v", err)
	}
}

func TestClassify(t *testing.T) {
	p := policy.Default()
	p.CachedErrors = []error{errNotFound}
	p.RetryableErrors = []error{errTimeout}
	p.Classifier = func(err error) (policy.Class, bool) {
		var v *validationError
		if errors.As(err, &v) {
			return policy.Cached, true
		}
		return 0, false
	}
	cases := []struct {
		name string
		err  error
		want policy.Class
	}{
		{"unknown error is retryable", errors.New("boom"), policy.Retryable},
		{"context canceled is retryable", context.Canceled, policy.Retryable},
		{"deadline is retryable", fmt.Errorf("call: %w", context.DeadlineExceeded), policy.Retryable},
		{"permanent marker", policy.Permanent(errors.New("bad")), policy.Cached},
		{"permanent marker wrapped", fmt.Errorf("handler: %w", policy.Permanent(errors.New("bad"))), policy.Cached},
		{"permanentf", policy.Permanentf("amount %d", -1), policy.Cached},
		{"transient marker beats CachedErrors", policy.Transient(errNotFound), policy.Retryable},
		{"outermost marker wins", policy.Permanent(policy.Transient(errors.New("x"))), policy.Cached},
		{"outermost marker wins, other way", policy.Transient(policy.Permanent(errors.New("x"))), policy.Retryable},
		{"CachedErrors by errors.Is", fmt.Errorf("lookup: %w", errNotFound), policy.Cached},
		{"RetryableErrors beat CachedErrors", errors.Join(errNotFound, errTimeout), policy.Retryable},
		{"classifier by errors.As", fmt.Errorf("x: %w", &validationError{"amount"}), policy.Cached},
		{"classifier beats markers", policy.Transient(&validationError{"amount"}), policy.Cached},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.Classify(tc.err); got != tc.want {
				t.Fatalf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

func TestMarkersKeepTheErrorChain(t *testing.T) {
	err := policy.Permanent(fmt.Errorf("charge: %w", errNotFound))
	if !errors.Is(err, errNotFound) || err.Error() != "charge: not found" {
		t.Fatalf("marker hides the chain: %v", err)
	}
	if policy.Permanent(nil) != nil || policy.Transient(nil) != nil {
		t.Fatal("marking nil must stay nil")
	}
	if !policy.Default().IsPermanent(err) || policy.Default().IsPermanent(errNotFound) {
		t.Fatal("IsPermanent disagrees with Classify")
	}
}
