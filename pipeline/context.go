package pipeline

import (
	"context"

	"github.com/oncemill/oncemill/internal/claimctx"
	"github.com/oncemill/oncemill/store"
)

// ClaimFromContext returns the claim the handler runs under, in either
// mode: its scope, key, fencing token and attempt number. ok is false
// outside the idempotency stage.
//
// A handler that writes to a system which can check a fencing token should
// pass Token along, so a stale worker's late write is refused there too.
func ClaimFromContext(ctx context.Context) (claim store.Claim, ok bool) {
	if l, ok := ctx.Value(claimctx.ClaimKey{}).(*store.Claim); ok {
		return *l, true
	}
	return store.Claim{}, false
}

// CheckLease confirms, with one store round trip, that the handler still
// holds its lease, and extends it. Call it right before a side effect that
// cannot take part in a transaction with the record (an HTTP call, an
// e-mail): a worker paused past its lease (GC, a stopped VM) then learns that
// another delivery took over instead of acting a second time. It returns an
// error wrapping store.ErrLeaseLost when the lease is gone (also when a heartbeat
// found it gone while CheckLease's own extend was in flight, which cancels
// ctx under it), and nil outside the idempotency stage's handler.
//
// In the one-transaction mode it returns nil at once: the claim is held by
// the handler's open transaction, which no other delivery can take over; a
// transaction whose connection died fails the handler's next statement.
func CheckLease(ctx context.Context) error {
	l, ok := ctx.Value(claimctx.LeaseKey{}).(claimctx.Lease)
	if !ok {
		return nil
	}
	return l.Check(ctx)
}
