package claimtx

import (
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres/internal/lazytx"
)

// The deferred claim (store.TxRequest.Deferrable). A claim of a new key
// decides nothing that the handler needs before its first statement: the
// record it inserts is the transaction's own until the commit. So the
// claim answers DecisionExecute without a round trip, and its statements
// go out with BEGIN and the handler's first statement, in one batch
// (lazytx.Prelude): the key's advisory lock without waiting and the insert
// of a new key's record. A message then costs BEGIN-and-claim-and-statement,
// the handler's other statements, and COMMIT: one round trip fewer than a
// transaction that begins on its own.
//
// When the key is held or has a row, the claim fails on the server, which
// aborts the transaction before the handler's statement runs: the
// statement, and every one after it, fails with ErrRefused, and Commit and
// Rollback return it. It wraps store.ErrLeaseLost: the stage claims again,
// decided up front, and replays the record, or waits for the holder, or
// runs the key if it came free. Nothing of the refused transaction
// commits.

// Token is a deferred claim's token: it has to be known before the claim
// is sent. The claim only takes a key that has no row, so no token of the
// key's current record is below it, and a later claim of the key takes
// the greater of the sequence's next and the row's token plus one.
const Token = 1

// ErrRefused is what the handler's statements, Commit and Rollback return
// after a deferred claim did not take the key.
var ErrRefused = fmt.Errorf("the claim sent with the handler's first statement did not take the key (another delivery holds it or has recorded it, or the claim failed), so nothing in this transaction commits; return the error: the delivery is claimed again and answered from the record: %w", store.ErrLeaseLost)

// Claim is a deferred claim's statements: lazytx.Prelude.
type Claim struct {
	Scope, Key string
	// Lock, when set, takes the key's lock (LockKey) in a statement of its
	// own, before Insert, whose result Read reads first; Insert then
	// returns the token.
	Lock    string
	LockKey int32
	// Insert inserts the new key's record with Args, and fails unless it
	// takes the key.
	Insert string
	Args   []any
}

var _ lazytx.Prelude = (*Claim)(nil)

// Queue queues the claim.
func (c *Claim) Queue(b *pgx.Batch) {
	if c.Lock != "" {
		b.Queue(c.Lock, c.LockKey)
	}
	b.Queue(c.Insert, c.Args...)
}

// Read reads the claim's results after BEGIN's (err). Any failure refuses
// the claim: a key held or recorded, and every other (BEGIN's, no partition
// for now, a lost connection), which the claim decided up front meets
// again and handles.
func (c *Claim) Read(br pgx.BatchResults, err error) error {
	switch {
	case err != nil:
	case c.Lock != "": // the lock, then the insert, which returns the token
		if _, err = br.Exec(); err == nil {
			var token int64
			err = br.QueryRow().Scan(&token)
		}
	default: // the insert, which fails unless it takes the key
		_, err = br.Exec()
	}
	if err != nil {
		return fmt.Errorf("oncemill: postgres: claim %q/%q: %w (%w)", c.Scope, c.Key, ErrRefused, err)
	}
	return nil
}
