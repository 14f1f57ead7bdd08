package worker

// The side effect the worker must not repeat: one ledger entry per charge of
// a payment. The ledger lives where the store lives: in memory with the
// memory store, in a PostgreSQL table written inside the handler's
// transaction with the postgres store, in a Redis hash with the redis store.

import (
	"context"
	"maps"
	"sync"
)

// Charge is one ledger entry.
type Charge struct {
	Scope       string // the run's key space: ledgers of different runs never mix
	PaymentID   string
	MessageUUID string
	Token       int64 // the fencing token of the lease the charge ran under (0 without oncemill)
	Attempt     int
}

// Ledger records charges and counts them per payment.
type Ledger interface {
	// Charge books one charge. It runs inside the handler, so with the
	// postgres store it writes in the handler's transaction.
	Charge(ctx context.Context, c Charge) error
	// Counts returns the number of charges per payment_id booked in scope.
	Counts(ctx context.Context, scope string) (map[string]int, error)
}

// MemoryLedger is the ledger beside the memory store.
type MemoryLedger struct {
	mu      sync.Mutex
	charges map[string]map[string]int // scope -> payment_id -> charges
}

// NewMemoryLedger returns an empty ledger.
func NewMemoryLedger() *MemoryLedger {
	return &MemoryLedger{charges: map[string]map[string]int{}}
}

// Charge books c.
func (l *MemoryLedger) Charge(_ context.Context, c Charge) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.charges[c.Scope] == nil {
		l.charges[c.Scope] = map[string]int{}
	}
	l.charges[c.Scope][c.PaymentID]++
	return nil
}

// Counts returns the charges per payment_id in scope.
func (l *MemoryLedger) Counts(_ context.Context, scope string) (map[string]int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.charges[scope]), nil
}

// TotalCharges is the number of ledger entries in counts.
func TotalCharges(counts map[string]int) int {
	total := 0
	for _, n := range counts {
		total += n
	}
	return total
}
