package postgres_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// A lease claim that answers without taking the key turns
// synchronous_commit off for its own transaction, so that the row lock it
// took costs no WAL flush; one that takes the key leaves the setting as it
// was. Each layout's lease statement runs here in a transaction of the
// test's, which then reads the setting the claim left.
func TestLeaseAnswerSkipsTheFlush(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	for _, layout := range []struct {
		name string
		stmt func(s *postgres.Store) string
		open func(t *testing.T) *postgres.Store
		// extra follows the arguments the layouts share: the partitioned
		// claim's partition width.
		extra []any
	}{
		{"delete", func(s *postgres.Store) string { return s.Statements()["begin"] },
			func(t *testing.T) *postgres.Store { return newStore(t, pool, postgres.Options{}) }, nil},
		{"partitioned", func(s *postgres.Store) string { return s.PartitionedStatements()["partClaimLease"] },
			func(t *testing.T) *postgres.Store {
				return newPartitioned(t, pool, testenv.Schema(t, pool), postgres.Options{})
			}, []any{time.Hour.Microseconds()}},
	} {
		t.Run(layout.name, func(t *testing.T) {
			s := layout.open(t)
			stmt := layout.stmt(s)
			// claim runs the lease statement for one key and returns its
			// decision and the transaction's synchronous_commit after it.
			claim := func() (store.Decision, string) {
				t.Helper()
				var decision int16
				var setting string
				err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
					if _, err := tx.Exec(t.Context(), "SET LOCAL synchronous_commit = on"); err != nil {
						return err
					}
					lease := time.Minute.Microseconds()
					args := append([]any{"flush", "k", "", lease, 2 * lease, "uuid-1"}, layout.extra...)
					if err := tx.QueryRow(t.Context(), stmt, args...).Scan(&decision, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil); err != nil {
						return err
					}
					return tx.QueryRow(t.Context(), "SHOW synchronous_commit").Scan(&setting)
				})
				if err != nil {
					t.Fatalf("lease claim: %v", err)
				}
				return store.Decision(decision), setting
			}
			if d, setting := claim(); d != store.DecisionExecute || setting != "on" {
				t.Fatalf("first claim = %v with synchronous_commit %q; want Execute with on", d, setting)
			}
			if d, setting := claim(); d != store.DecisionHeld || setting != "off" {
				t.Fatalf("claim of a held key = %v with synchronous_commit %q; want Held with off", d, setting)
			}
		})
	}
}
