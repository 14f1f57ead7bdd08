package postgres_test

import (
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/storetest"
)

// TestContract runs the store contract suite against the real database. The
// subtests share one migrated table (each uses its own scope); Advance moves
// every stored deadline earlier; the background cleaner is off.
func TestContract(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	newStore(t, pool, postgres.Options{Schema: schema}) // migrates
	qualified := table(schema, "")
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		// No t.Parallel here: Advance moves every record of the shared table,
		// so the subtests must run one after another.
		s, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return storetest.Harness{
			Store:   s,
			Advance: func(d time.Duration) { advance(t, pool, qualified, d) },
		}
	})
}

// The suite again with ClaimLease committing asynchronously: the decisions must
// not depend on it.
func TestContractAsyncBegin(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	newStore(t, pool, postgres.Options{Schema: schema})
	qualified := table(schema, "")
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		s, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1, AsyncBegin: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return storetest.Harness{
			Store:   s,
			Advance: func(d time.Duration) { advance(t, pool, qualified, d) },
		}
	})
}

// TestTransactionalContract runs the one-transaction mode's contract suite
// against the real database.
func TestTransactionalContract(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema})
	qualified := table(schema, "")
	storetest.RunTransactional(t, func(t *testing.T) storetest.TxHarness {
		return storetest.TxHarness{
			Store:   s,
			Get:     s.Get,
			Advance: func(d time.Duration) { advance(t, pool, qualified, d) },
		}
	})
}
