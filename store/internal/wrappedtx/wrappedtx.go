// Package wrappedtx lets a store hand out another store's transaction with
// its Commit replaced, without a type of its own whose methods would be
// part of its API.
package wrappedtx

import (
	"context"

	"github.com/oncemill/oncemill/store"
)

// Tx is the embedded store.Tx (its Context and Rollback) with Commit done
// by CommitFunc, which commits the embedded one itself.
type Tx struct {
	store.Tx
	CommitFunc func(ctx context.Context, result []byte) error
}

var _ store.Tx = (*Tx)(nil)

// Commit implements store.Tx: CommitFunc.
func (t *Tx) Commit(ctx context.Context, result []byte) error { return t.CommitFunc(ctx, result) }
