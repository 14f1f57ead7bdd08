package main

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/oncemill/oncemill/keygen"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/memory"
)

// nopTx is a transaction manager that does nothing.
type nopTx struct{}

func (nopTx) Begin(ctx context.Context) (context.Context, error) { return ctx, nil }
func (nopTx) Commit(context.Context) error                       { return nil }
func (nopTx) Rollback(context.Context) error                     { return nil }

// txMemory is a memory store that claims to record inside transactions.
type txMemory struct{ *memory.Store }

func (s txMemory) CompleteInTx(ctx context.Context, l store.Lease, o store.Outcome) error {
	return s.Complete(ctx, l, o)
}

// The transactional mode refuses a store that would record after the
// commit: an earlier version wrapped the store to count contention and so
// hid its CompleteInTx, silently recording outside the transaction.
func TestTransactionalModeNeedsATxCompleter(t *testing.T) {
	st, err := memory.New(memory.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	deps := guardDeps{store: st, tx: nopTx{}, keys: keygen.UUID(), log: slog.New(slog.NewTextHandler(io.Discard, nil))}

	_, err = newGuard(defaultConfig(), deps)
	if err == nil || !strings.Contains(err.Error(), "store.TxCompleter") {
		t.Fatalf("newGuard with a memory store in transactional mode = %v, want an error naming store.TxCompleter", err)
	}

	deps.store = txMemory{st}
	if _, err := newGuard(defaultConfig(), deps); err != nil {
		t.Fatalf("newGuard with a TxCompleter store: %v", err)
	}
	deps.store, deps.tx = st, nil
	if _, err := newGuard(defaultConfig(), deps); err != nil {
		t.Fatalf("newGuard without a transaction: %v", err)
	}
}
