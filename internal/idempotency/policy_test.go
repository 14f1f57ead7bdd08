package idempotency_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oncemill/oncemill"
	"github.com/oncemill/oncemill/internal/idempotency"
	"github.com/oncemill/oncemill/policy"
	"github.com/oncemill/oncemill/store/memory"
)

// The policy is validated when the stage is built, and every error names
// the builder's WithPolicy.
func TestPolicyValidationSaysWhatToChange(t *testing.T) {
	t.Parallel()
	st, _ := memory.New(memory.Options{})
	t.Cleanup(func() { _ = st.Close() })
	// The zero policy is the defaults, and a literal that sets what it
	// changes is valid.
	for _, p := range []policy.Policy{{}, {SuccessTTL: 7 * 24 * time.Hour, CachedErrors: []error{errors.New("insufficient funds")}}} {
		if _, err := idempotency.NewLeased(st, idempotency.Config{Policy: p}); err != nil {
			t.Fatalf("policy %+v: %v", p, err)
		}
	}
	cases := map[string]struct {
		p       policy.Policy
		setting string
		says    string
	}{
		"success ttl":     {policy.Policy{SuccessTTL: -1}, "WithPolicy(Policy.SuccessTTL)", "negative"},
		"failure ttl":     {policy.Policy{FailureTTL: -1}, "WithPolicy(Policy.FailureTTL)", "negative"},
		"lease":           {policy.Policy{LeaseDuration: -time.Second}, "WithPolicy(Policy.LeaseDuration)", "negative"},
		"lease too short": {policy.Policy{LeaseDuration: 2}, "WithPolicy(Policy.LeaseDuration)", "too short"},
		"heartbeat":       {policy.Policy{Heartbeat: -1}, "WithPolicy(Policy.Heartbeat)", "negative"},
		"heartbeat long":  {policy.Policy{Heartbeat: 30 * time.Second}, "WithPolicy(Policy.Heartbeat)", "not shorter than Lease"},
		"attempts":        {policy.Policy{MaxAttempts: -1}, "WithPolicy(Policy.MaxAttempts)", "negative"},
		"held key mode":   {policy.Policy{HeldKey: 5}, "WithPolicy(Policy.HeldKey)", "policy.HeldKeyWait"},
		"held key wait":   {policy.Policy{HeldKeyTimeout: -1}, "WithPolicy(Policy.HeldKeyTimeout)", "negative"},
		"missing key":     {policy.Policy{MissingKey: 3}, "WithPolicy(Policy.MissingKey)", "policy.MissingKeyReject"},
		"result size":     {policy.Policy{MaxResultBytes: -1}, "WithPolicy(Policy.MaxResultBytes)", "negative"},
		"payload size":    {policy.Policy{MaxPayloadBytes: -1}, "WithPolicy(Policy.MaxPayloadBytes)", "negative"},
		"attempt cap":     {policy.Policy{MaxAttemptDelay: -1}, "WithPolicy(Policy.MaxAttemptDelay)", "negative"},
		"attempt delays":  {policy.Policy{AttemptDelay: 2 * time.Minute, MaxAttemptDelay: time.Minute}, "WithPolicy(Policy.MaxAttemptDelay)", "below AttemptDelay"},
		"exhausted mode":  {policy.Policy{Exhausted: 4}, "WithPolicy(Policy.Exhausted)", "policy.ExhaustedKeep"},
		"finished key":    {policy.Policy{FinishedKey: 2}, "WithPolicy(Policy.FinishedKey)", "policy.FinishedKeyReplay"},
		"no cache, drop":  {policy.Policy{NeverCacheFailures: true, Exhausted: policy.ExhaustedDrop}, "WithPolicy(Policy.Exhausted)", "NeverCacheFailures caches none"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, err := idempotency.NewLeased(st, idempotency.Config{Policy: tc.p})
			var ce *oncemill.ConfigError
			if !errors.Is(err, oncemill.ErrInvalidConfig) || !errors.As(err, &ce) || ce.Setting != tc.setting || !strings.Contains(err.Error(), tc.says) {
				t.Fatalf("got %v, want a ConfigError for %s saying %q", err, tc.setting, tc.says)
			}
			if !strings.HasPrefix(err.Error(), "oncemill: invalid configuration: "+tc.setting+": ") {
				t.Fatalf("message %q does not start with the one prefix and the setting", err)
			}
		})
	}
}
