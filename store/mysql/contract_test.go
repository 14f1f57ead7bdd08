package mysql_test

import (
	"context"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/mysql"
	"github.com/oncemill/oncemill/store/storetest"
)

// The store has what the contract suite checks beyond store.Store and
// store.Admin: if it lost either, its subtests would be skipped, and this
// would not compile.
var (
	_ store.Transactional = (*mysql.Store)(nil)
	_ interface {
		DeleteExpired(context.Context, int) (int, error)
	} = (*mysql.Store)(nil)
)

// TestContract runs the store contract suite against the local MariaDB, the
// one-transaction mode's contract (Transactional/) and DeleteExpired
// included. The subtests share one migrated table (each uses its own
// scope); Advance moves every stored deadline earlier; the background
// cleaner is off.
func TestContract(t *testing.T) {
	t.Parallel()
	db := testDB(t)
	newStore(t, db, mysql.Options{}) // migrates
	storetest.Run(t, func(t *testing.T) storetest.Harness {
		// No t.Parallel here: Advance moves every record of the shared
		// table, so the subtests run one after another.
		s, err := mysql.New(db, mysql.Options{CleanupInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return storetest.Harness{
			Store:   s,
			Advance: func(d time.Duration) { advance(t, db, "", d) },
		}
	})
}
