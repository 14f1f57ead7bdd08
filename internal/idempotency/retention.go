package idempotency

import (
	"cmp"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/oncemill/oncemill/internal/configerr"
	"github.com/oncemill/oncemill/policy"
)

// Retention is how long one handler's outcomes are kept
// (Config.RetentionFor). A zero field means the policy's.
type Retention struct {
	// SuccessTTL overrides policy.SuccessTTL.
	SuccessTTL time.Duration
	// FailureTTL overrides policy.FailureTTL.
	FailureTTL time.Duration
}

// retention is the TTLs one delivery's record is written with: the policy's,
// or its handler's (Config.RetentionFor), resolved once at configuration.
type retention struct {
	success, failure time.Duration
	retain           time.Duration // how long a record is kept at least: the longest outcome TTL
}

func newRetention(r Retention, p policy.Policy) retention {
	t := retention{success: cmp.Or(r.SuccessTTL, p.SuccessTTL), failure: cmp.Or(r.FailureTTL, p.FailureTTL)}
	t.retain = max(t.success, t.failure)
	return t
}

// retentionsFor validates Config.RetentionFor and resolves it against the
// policy; nil when it names no handler, so that the hot path skips the lookup.
func retentionsFor(byHandler map[string]Retention, p policy.Policy) (map[string]*retention, error) {
	if len(byHandler) == 0 {
		return nil, nil
	}
	out := make(map[string]*retention, len(byHandler))
	for handler, r := range byHandler {
		switch {
		case handler == "":
			return nil, configerr.New("WithRetentionFor", "a handler name is empty; name the Watermill handler (router.AddHandler's first argument) whose TTLs to override")
		case r.SuccessTTL < 0 || r.FailureTTL < 0:
			return nil, configerr.New("WithRetentionFor", "handler %q: TTLs %v and %v; a TTL must be positive, or 0 for the policy's", handler, r.SuccessTTL, r.FailureTTL)
		case r.SuccessTTL == 0 && r.FailureTTL == 0:
			return nil, configerr.New("WithRetentionFor", "handler %q: both TTLs are 0, the policy's: set the TTL to override, or drop the entry", handler)
		}
		t := newRetention(r, p)
		out[handler] = &t
	}
	return out, nil
}

// retentionOf is the TTLs of the message's handler: its override, else the
// policy's. A map lookup by the handler name: no allocation.
func (s *idempotency) retentionOf(msg *message.Message) *retention {
	if r, ok := s.retentions[message.HandlerNameFromCtx(msg.Context())]; ok {
		return r
	}
	return &s.ttl
}
