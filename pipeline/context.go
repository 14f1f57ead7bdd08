package pipeline

import (
	"context"

	"github.com/oncemill/oncemill/store"
)

type claimKey struct{}

// ClaimFromContext returns the claim the handler runs under, in either
// mode: its scope, key, fencing token and attempt number. ok is false
// outside the idempotency stage.
//
// A handler that writes to a system which can check a fencing token should
// pass Token along, so a stale worker's late write is refused there too.
func ClaimFromContext(ctx context.Context) (claim store.Claim, ok bool) {
	if l, ok := ctx.Value(claimKey{}).(*store.Claim); ok {
		return *l, true
	}
	return store.Claim{}, false
}
