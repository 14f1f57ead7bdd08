package postgres_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store/postgres"
)

// planArgs are sample arguments of every statement of the store, to EXPLAIN
// them with.
var planArgs = map[string]string{
	"begin":          `('s', 'k', 'fp', 1000000, 2000000, 'uuid')`,
	"claimNew":       `('s', 'k', 'fp', 1000000, 2000000, 42, 'uuid')`,
	"claim":          `('s', 'k', 'fp', 1000000, 2000000, 'uuid', 5000, 42)`,
	"commitResult":   `('s', 'k', '\x01'::bytea, 1000000)`,
	"recordRollback": `('s', 'k', 'fp', 4, 7, 1, 1000000, '', '', 2000000, 42, 'uuid', 60000000)`,
	"complete":       `('s', 'k', 7, 2, '\x01'::bytea, '', '', 1000000)`,
	"extend":         `('s', 'k', 7, 1000000)`,
	"release":        `('s', 'k', 7, 1000000, 0, 60000000)`,
	"releaseDelete":  `('s', 'k', 7)`,
	"get":            `('s', 'k')`,
	"del":            `('s', 'k', 7)`,
	"cleanupBatch":   `(100, '-infinity')`,
	"cleanupLag":     ``,
}

// No statement of the store may come to scan the records table as it
// grows: every one names its row by the primary key or walks the purge_at
// index, under the generic plan that a prepared statement settles on and
// under a custom plan, on a freshly migrated empty table (whose statistics
// invite a sequential scan) and at 100k rows.
func TestPlansUseIndexes(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema})
	ctx := t.Context()
	qualified := table(schema, "")
	statements := s.Statements()
	if len(statements) != len(planArgs) {
		t.Fatalf("%d statements, %d with sample arguments: give every statement its arguments here", len(statements), len(planArgs))
	}
	check := func(when string) { checkPlans(t, pool, when, statements, planArgs) }
	check("empty")
	_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s
		(scope, key, fingerprint, status, token, attempt, created_at, updated_at, expires_at, purge_at)
		SELECT 'scope-' || (i %% 10), md5(i::text), 'fp', 1 + i %% 4, i, 1, now(), now(),
			now() + (i %% 100 - 50) * interval '1 minute', now() + (i %% 100 - 40) * interval '1 minute'
		FROM generate_series(1, 100000) i`, qualified))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+qualified); err != nil {
		t.Fatal(err)
	}
	check("at 100k rows")
}

// checkPlans EXPLAINs every statement under a generic and a custom plan,
// and fails when one scans a records table (or a partition of one) or uses
// no index.
func checkPlans(t *testing.T, pool *pgxpool.Pool, when string, statements, args map[string]string) {
	t.Helper()
	ctx := t.Context()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	for name, sql := range statements {
		if _, err := conn.Exec(ctx, "PREPARE oncemill_plan AS "+sql, pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatalf("%s: PREPARE: %v", name, err)
		}
		for _, mode := range []string{"force_generic_plan", "force_custom_plan"} {
			if _, err := conn.Exec(ctx, "SET plan_cache_mode = "+mode, pgx.QueryExecModeSimpleProtocol); err != nil {
				t.Fatal(err)
			}
			rows, err := conn.Query(ctx, "EXPLAIN EXECUTE oncemill_plan"+args[name], pgx.QueryExecModeSimpleProtocol)
			if err != nil {
				t.Fatalf("%s: EXPLAIN: %v", name, err)
			}
			lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
			if err != nil {
				t.Fatalf("%s: EXPLAIN: %v", name, err)
			}
			plan := strings.Join(lines, "\n")
			if strings.Contains(plan, "Seq Scan on oncemill_records") {
				t.Errorf("%s, %s, %s: the plan scans the records table:\n%s", when, mode, name, plan)
			}
			if !strings.Contains(plan, "Index") {
				t.Errorf("%s, %s, %s: the plan uses no index:\n%s", when, mode, name, plan)
			}
		}
		if _, err := conn.Exec(ctx, "DEALLOCATE oncemill_plan; RESET plan_cache_mode", pgx.QueryExecModeSimpleProtocol); err != nil {
			t.Fatal(err)
		}
	}
}

// The partitioned layout's statements, and those it shares with the DELETE
// layout, probe the primary key of every partition: none scans one, empty
// or at 100k rows spread over the partitions.
func TestPlansUseIndexesPartitioned(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema, Layout: postgres.LayoutPartitioned})
	ctx := t.Context()
	qualified := table(schema, "")
	statements := s.PartitionedStatements()
	args := map[string]string{
		"partClaimLease":     `('s', 'k', 'fp', 1000000, 2000000, 'uuid', 60000000)`,
		"partClaimNew":       `('s', 'k', 'fp', 1000000, 2000000, 'uuid')`,
		"partClaimTx":        `('s', 'k', 'fp', 1000000, 2000000, 'uuid', 60000000)`,
		"partRecordRollback": `('s', 'k', 'fp', 4, 7, 1, 1000000, '', '', 2000000, 60000000, 'uuid', 60000000)`,
		"partCompleteMove":   `('s', 'k', 7, 2, '\x01'::bytea, '', '', 1000000, 42)`,
		"partReleaseMove":    `('s', 'k', 7, 1000000, 0, 60000000, 42)`,
		"partExtendMove":     `('s', 'k', 7, 1000000, 42)`,
	}
	for name, sql := range s.Statements() {
		switch name {
		case "commitResult", "complete", "extend", "release", "releaseDelete", "get", "del":
			statements[name], args[name] = sql, planArgs[name]
		}
	}
	checkPlans(t, pool, "empty", statements, args)
	// 100k rows spread over every partition the store made (a partition
	// left empty may rightly be scanned: it has no page to read), whatever
	// the time of day puts in which.
	parts, err := s.Partitions(ctx)
	if err != nil || len(parts) == 0 {
		t.Fatalf("partitions %v, %v: want those the store made", parts, err)
	}
	for n, part := range parts {
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s
			(scope, key, fingerprint, status, token, attempt, created_at, updated_at, expires_at, purge_at, claimed_at)
			SELECT 'scope-' || (i %% 10), md5(%d || '-' || i), 'fp', 1 + i %% 4, %d * 1000000 + i, 1, now(), now(),
				now() + (i %% 100 - 50) * interval '1 minute', now() + (i %% 100 - 40) * interval '1 minute',
				$1::timestamptz + (i %% 1000) * (($2::timestamptz - $1::timestamptz) / 1000)
			FROM generate_series(1, %d) i`, qualified, n, n, 100000/len(parts)), part.From, part.To)
		if err != nil {
			t.Fatalf("filling %s [%v, %v): %v", part.Name, part.From, part.To, err)
		}
	}
	if _, err := pool.Exec(ctx, "ANALYZE "+qualified); err != nil {
		t.Fatal(err)
	}
	checkPlans(t, pool, "at 100k rows", statements, args)
}

// The watermark mode's statements name the partition's row by its primary
// key, empty and with 10k partitions' rows.
func TestPlansUseIndexesWatermarks(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newStore(t, pool, postgres.Options{Schema: schema})
	args := map[string]string{
		"wmClaim":        `('g', 't', 0, 42, 'uuid', 5000)`,
		"wmClaimNew":     `('g', 't', 0, 42, 'uuid', 5000)`,
		"wmCommitResult": `('g', 't', 0, '\x01'::bytea)`,
		"wmCommitFast":   `('g', 't', 0, 42, 'uuid', '\x01'::bytea)`,
		"wmRetryable":    `('g', 't', 0, 42, 2, 3000000)`,
		"wmFailed":       `('g', 't', 0, 42, 2, 'uuid', 'cached', 'declined')`,
		"wmLock":         `('g', 't', 0)`,
		"wmMove":         `('g', 't', 0, 42)`,
		"wmDelete":       `('g', 't', 0)`,
	}
	statements := s.WatermarkStatements()
	if len(statements) != len(args) {
		t.Fatalf("%d statements, %d with sample arguments", len(statements), len(args))
	}
	checkPlans(t, pool, "empty", statements, args)
	wm := pgx.Identifier{schema, postgres.DefaultTable + "_watermarks"}.Sanitize()
	_, err := pool.Exec(t.Context(), fmt.Sprintf(`INSERT INTO %s (group_id, topic, partition, next_offset, last_offset, last_status,
		attempt_offset, attempts, token, updated_at)
		SELECT 'group-' || (i %% 100), 'topic-' || (i / 100), i %% 16, i, i - 1, 2, i, 0, 1, now() FROM generate_series(1, 10000) i
		ON CONFLICT DO NOTHING`, wm))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), "ANALYZE "+wm); err != nil {
		t.Fatal(err)
	}
	checkPlans(t, pool, "at 10k rows", statements, args)
}
