package pipeline

import (
	"context"

	"github.com/oncemill/oncemill/store"
)

type leaseKey struct{}

// LeaseFromContext returns the lease the handler runs under: its fencing
// token and attempt number. ok is false outside the idempotency stage.
//
// A handler that writes to a system which can check a fencing token should
// pass Token along, so a stale worker's late write is refused there too.
func LeaseFromContext(ctx context.Context) (lease store.Lease, ok bool) {
	if l, ok := ctx.Value(leaseKey{}).(*store.Lease); ok {
		return *l, true
	}
	return store.Lease{}, false
}
