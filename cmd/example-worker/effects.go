package main

// The side effect the worker must not repeat: one ledger entry per charge of
// a payment. The ledger lives where the store lives: in memory with the
// memory store, in a PostgreSQL table written inside the handler's
// transaction with the postgres store, in a Redis hash with the redis store.

import (
	"context"
	"fmt"
	"sync"
)

// charge is one ledger entry.
type charge struct {
	Scope       string // the run's key space: ledgers of different runs never mix
	PaymentID   string
	MessageUUID string
	Token       int64 // the fencing token of the lease the charge ran under (0 without oncemill)
	Attempt     int
}

// effectLedger records charges and counts them per payment.
type effectLedger interface {
	// charge books one charge. It runs inside the handler, so with the
	// postgres store it writes in the handler's transaction.
	charge(ctx context.Context, c charge) error
	// counts returns the number of charges per payment_id booked in scope.
	counts(ctx context.Context, scope string) (map[string]int, error)
}

// memoryLedger is the ledger of a self-contained run.
type memoryLedger struct {
	mu      sync.Mutex
	charges map[string]map[string]int // scope -> payment_id -> charges
}

func newMemoryLedger() *memoryLedger {
	return &memoryLedger{charges: map[string]map[string]int{}}
}

func (l *memoryLedger) charge(_ context.Context, c charge) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.charges[c.Scope] == nil {
		l.charges[c.Scope] = map[string]int{}
	}
	l.charges[c.Scope][c.PaymentID]++
	return nil
}

func (l *memoryLedger) counts(_ context.Context, scope string) (map[string]int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]int, len(l.charges[scope]))
	for id, n := range l.charges[scope] {
		out[id] = n
	}
	return out, nil
}

// totalCharges is the number of ledger entries in counts.
func totalCharges(counts map[string]int) int {
	total := 0
	for _, n := range counts {
		total += n
	}
	return total
}

// audit checks the ledger counts against the commands: double is the number
// of extra charges, the sum over commands of (charges-1) where charges > 1;
// lost is the number of valid commands never charged. doubled names the
// first few payments charged more than once, for the failure message.
func audit(counts map[string]int, commands []paymentCommand, valid func(i int) bool) (double, lost int, doubled []string) {
	for i, c := range commands {
		n := counts[c.PaymentID]
		if n > 1 {
			double += n - 1
			if len(doubled) < 5 {
				doubled = append(doubled, fmt.Sprintf("%s x%d", c.PaymentID, n))
			}
		}
		if n == 0 && valid(i) {
			lost++
		}
	}
	return double, lost, doubled
}
