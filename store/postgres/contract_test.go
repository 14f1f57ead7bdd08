package postgres_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
	"github.com/oncemill/oncemill/store/storetest"
)

// The store has what the contract suite checks beyond store.Store and
// store.Admin: if it lost either, its subtests would be skipped, and this
// would not compile.
var (
	_ store.Transactional = (*postgres.Store)(nil)
	_ interface {
		DeleteExpired(context.Context, int) (int, error)
	} = (*postgres.Store)(nil)
)

// TestContract runs the store contract suite against the real database,
// the one-transaction mode's contract (Transactional/) and DeleteExpired
// included. The subtests share one migrated table (each uses its own scope);
// Advance moves every stored deadline earlier; the background cleaner is off.
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

// The suite on the partitioned layout (LayoutPartitioned): the decisions,
// tokens and attempt counts must not depend on the layout.
func TestContractPartitioned(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	newStore(t, pool, postgres.Options{Schema: schema, Layout: postgres.LayoutPartitioned}) // migrates
	qualified := table(schema, "")
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		s, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1, Layout: postgres.LayoutPartitioned})
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
