package pipeline

import (
	"context"

	"github.com/oncemill/oncemill/store"
)

type leaseKey struct{}

// ClaimFromContext returns the lease the handler runs under: its fencing
// token and attempt number. ok is false outside the idempotency stage.
//
// A handler that writes to a system which can check a fencing token should
// pass Token along, so a stale worker's late write is refused there too.
func ClaimFromContext(ctx context.Context) (lease store.Claim, ok bool) {
	if l, ok := ctx.Value(leaseKey{}).(*store.Claim); ok {
		return *l, true
	}
	return store.Claim{}, false
}
