package idempotency

import (
	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/policy"
)

// validatePolicy reports the first setting of p that cannot work, saying
// what to change, as a *oncemill.ConfigError naming the builder's
// WithPolicy. Zero fields are valid: they mean their defaults.
func validatePolicy(p policy.Policy) error {
	bad := func(field, format string, args ...any) error {
		return configerr.New("WithPolicy(Policy."+field+")", format, args...)
	}
	def := policy.Policy{}.WithDefaults()
	raw := p
	p = p.WithDefaults()
	switch {
	case p.SuccessTTL < 0:
		return bad("SuccessTTL", "%v is negative; set it longer than the broker's redelivery horizon, or leave it 0 for %v", p.SuccessTTL, def.SuccessTTL)
	case p.FailureTTL < 0:
		return bad("FailureTTL", "%v is negative; leave it 0 for %v", p.FailureTTL, def.FailureTTL)
	case p.LeaseDuration < 0:
		return bad("LeaseDuration", "%v is negative; leave it 0 for %v", p.LeaseDuration, def.LeaseDuration)
	case p.Heartbeat < 0:
		return bad("Heartbeat", "%v is negative; leave it 0 for a third of LeaseDuration", p.Heartbeat)
	case p.Heartbeat == 0:
		return bad("LeaseDuration", "%v is too short to beat within; use a lease of a millisecond or more", p.LeaseDuration)
	case p.Heartbeat >= p.LeaseDuration:
		return bad("Heartbeat", "%v is not shorter than LeaseDuration %v, so the lease would expire between beats; use less than LeaseDuration, or leave it 0 for %v (a third of LeaseDuration, room for two missed beats)", raw.Heartbeat, p.LeaseDuration, p.LeaseDuration/3)
	case p.MaxAttempts < 0:
		return bad("MaxAttempts", "%d is negative; set 1 or more, or leave it 0 for %d", p.MaxAttempts, def.MaxAttempts)
	case raw.MaxAttemptDelay < 0:
		return bad("MaxAttemptDelay", "%v is negative; leave it 0 for %v, or set AttemptDelay negative for no pause", raw.MaxAttemptDelay, def.MaxAttemptDelay)
	case p.MaxAttemptDelay < p.AttemptDelay:
		return bad("MaxAttemptDelay", "%v is below AttemptDelay %v; raise it, or leave it 0", p.MaxAttemptDelay, p.AttemptDelay)
	case p.Exhausted != policy.ExhaustedKeep && p.Exhausted != policy.ExhaustedDrop:
		return bad("Exhausted", "%v is not a mode; use policy.ExhaustedKeep or ExhaustedDrop", p.Exhausted)
	case p.NeverCacheFailures && p.Exhausted == policy.ExhaustedDrop:
		return bad("Exhausted", "is ExhaustedDrop, which caches the failure of a message whose attempts ran out, and NeverCacheFailures caches none; leave Exhausted 0, or NeverCacheFailures false")
	case p.HeldKey < policy.HeldKeyWait || p.HeldKey > policy.HeldKeyReject:
		return bad("HeldKey", "%v is not a mode; use policy.HeldKeyWait, HeldKeyNack or HeldKeyReject", p.HeldKey)
	case p.FinishedKey != policy.FinishedKeyReplay && p.FinishedKey != policy.FinishedKeyReject:
		return bad("FinishedKey", "%v is not a mode; use policy.FinishedKeyReplay or FinishedKeyReject", p.FinishedKey)
	case p.HeldKeyTimeout < 0:
		return bad("HeldKeyTimeout", "%v is negative; leave it 0 for %v", p.HeldKeyTimeout, def.HeldKeyTimeout)
	case p.MissingKey != policy.MissingKeyReject && p.MissingKey != policy.MissingKeyRunUnguarded:
		return bad("MissingKey", "%v is not a mode; use policy.MissingKeyReject or MissingKeyRunUnguarded", p.MissingKey)
	case p.MaxResultBytes < 0:
		return bad("MaxResultBytes", "%d is negative; leave it 0 for %d", p.MaxResultBytes, def.MaxResultBytes)
	case p.MaxPayloadBytes < 0:
		return bad("MaxPayloadBytes", "%d is negative; leave it 0 for %d", p.MaxPayloadBytes, def.MaxPayloadBytes)
	}
	return nil
}
