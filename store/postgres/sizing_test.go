package postgres_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store/postgres"
)

// sizingRows is how many records BenchmarkBytesPerRow stores in each
// layout: enough that a partition holds thousands of rows and the fixed
// cost of an empty partition (its index's metapage) is a small share.
const sizingRows = 200_000

// sizingDatabase is a pool on a database of the benchmark's own, dropped at
// its end: how soon an old row version is pruned from its page depends on
// the oldest transaction open in the same database, and other tests'
// transactions in the shared one would change the figure.
func sizingDatabase(b *testing.B) *pgxpool.Pool {
	b.Helper()
	admin := testenv.Pool(b)
	name := "oncemill_sizing_" + strings.ToLower(rand.Text()[:8])
	if _, err := admin.Exec(b.Context(), "CREATE DATABASE "+name); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			b.Errorf("dropping database %s: %v", name, err)
		}
	})
	return testenv.Pool(b, func(c *pgxpool.Config) { c.ConnConfig.Database = name })
}

// BenchmarkBytesPerRow measures the space one record takes on disk in each
// layout, table plus indexes (pg_total_relation_size, summed over the
// partitions in the partitioned layout), at 200k records of the shape the
// receiver writes: scope "payments", a message UUID as the key and as
// message_uuid, a 16-character payload fingerprint, and a stored result of
// 0 or 256 bytes. The records are written one at a time as the lease mode
// writes them (the claim's insert, then Complete's update of the same row,
// each committed), with claim times spread over one day's retention (the
// partitioned layout's 24 one-hour partitions, and those the store creates
// ahead), by a server-side loop rather than the store's statements (which
// would stamp every claim now), and the table is then vacuumed, as
// autovacuum would. The DELETE layout's figure is a table that has not yet
// deleted anything: its steady state adds the free space that deletes
// leave. It reports bytes/row (table and indexes),
// heap-bytes/row, index-bytes/row and the partitions (docs/benchmarks.md).
//
//	go test -run='^$' -bench=BytesPerRow -benchtime=1x ./store/postgres
func BenchmarkBytesPerRow(b *testing.B) {
	for _, result := range []int{0, 256} {
		for _, layout := range []struct {
			name   string
			layout postgres.Layout
		}{{"delete", postgres.LayoutDelete}, {"partitioned", postgres.LayoutPartitioned}} {
			b.Run(fmt.Sprintf("result=%dB/layout=%s", result, layout.name), func(b *testing.B) {
				pool := sizingDatabase(b)
				schema := testenv.Schema(b, pool)
				newStore(b, pool, postgres.Options{Schema: schema, Layout: layout.layout, Retention: 24 * time.Hour})
				qualified := table(schema, "")
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
				defer cancel()
				exec := func(sql string) {
					b.Helper()
					if _, err := pool.Exec(ctx, sql); err != nil {
						b.Fatalf("%s: %v", sql, err)
					}
				}
				var now time.Time
				if err := pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil {
					b.Fatal(err)
				}
				claimedAt, extraCol := "", ""
				if layout.layout == postgres.LayoutPartitioned {
					// The past day's partitions, one hour each, as the
					// upkeep would have made them.
					end := now.Truncate(time.Hour)
					for h := 24; h >= 1; h-- {
						lower := end.Add(-time.Duration(h) * time.Hour)
						exec(fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM ('%s') TO ('%s') WITH (fillfactor = 80)",
							pgx.Identifier{schema, fmt.Sprintf("past_%02d", h)}.Sanitize(), qualified,
							lower.UTC().Format(time.RFC3339Nano), lower.Add(time.Hour).UTC().Format(time.RFC3339Nano)))
						exec("CREATE UNIQUE INDEX ON " + pgx.Identifier{schema, fmt.Sprintf("past_%02d", h)}.Sanitize() + " (scope, key)")
					}
					claimedAt, extraCol = ", t", ", claimed_at"
				}
				conn, err := pool.Acquire(ctx)
				if err != nil {
					b.Fatal(err)
				}
				defer conn.Release()
				// Each record as the store writes it, one at a time: the
				// claim's insert, committed, then Complete's update of the
				// row, committed, so that each update finds its page as it
				// would (a HOT update, the old version pruned later). Their
				// claim times are spread over the day before now, oldest
				// first. synchronous_commit off: the WAL flush changes no
				// page.
				if _, err := conn.Exec(ctx, "SET synchronous_commit = off"); err != nil {
					b.Fatal(err)
				}
				resultSQL := "NULL"
				if result > 0 {
					resultSQL = fmt.Sprintf("decode(repeat('ab', %d), 'hex')", result)
				}
				where := "scope = 'payments' AND key = k"
				if layout.layout == postgres.LayoutPartitioned {
					where += " AND claimed_at = t" // the store's Complete probes every partition for the key: the same row
				}
				fill := fmt.Sprintf(`DO $fill$
DECLARE
	t timestamptz;
	k text;
BEGIN
	FOR i IN 1..%d LOOP
		t := '%s'::timestamptz - (%d - i) * (interval '24 hours' / %d);
		k := gen_random_uuid()::text;
		INSERT INTO %s (scope, key, fingerprint, status, token, attempt, created_at, updated_at, expires_at, purge_at, message_uuid%s)
		VALUES ('payments', k, substr(md5(i::text), 1, 16), 1, i, 1, t, t, t + interval '1 minute', t + interval '1 minute' + interval '24 hours',
			gen_random_uuid()::text%s);
		COMMIT;
		UPDATE %s SET status = 2, result = %s, expires_at = t + interval '24 hours', updated_at = t + interval '20 milliseconds'
		WHERE %s;
		COMMIT;
	END LOOP;
END
$fill$`, sizingRows, now.UTC().Format(time.RFC3339Nano), sizingRows, sizingRows, qualified, extraCol, claimedAt, qualified, resultSQL, where)
				b.ResetTimer()
				for b.Loop() {
					if _, err := conn.Exec(ctx, fill, pgx.QueryExecModeSimpleProtocol); err != nil {
						b.Fatalf("filling: %v", err)
					}
					if _, err := conn.Exec(ctx, "VACUUM (ANALYZE) "+qualified); err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				var total, heap, index, parts int64
				// The table, or the partitioned table and its partitions.
				err = pool.QueryRow(ctx, `SELECT sum(pg_total_relation_size(c.oid)),
						sum(pg_relation_size(c.oid)) + coalesce(sum(pg_relation_size(nullif(c.reltoastrelid, 0))), 0),
						sum(pg_indexes_size(c.oid)), count(*) FILTER (WHERE c.relispartition)
					FROM pg_class c
					WHERE c.oid = $1::regclass OR c.oid IN (SELECT relid FROM pg_partition_tree($1::regclass))`, qualified).Scan(&total, &heap, &index, &parts)
				if err != nil {
					b.Fatal(err)
				}
				var rows int64
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM "+qualified).Scan(&rows); err != nil || rows != int64(sizingRows*b.N) {
					b.Fatalf("%d rows, %v; want %d", rows, err, sizingRows*b.N)
				}
				b.ReportMetric(float64(total)/float64(rows), "bytes/row")
				b.ReportMetric(float64(heap)/float64(rows), "heap-bytes/row")
				b.ReportMetric(float64(index)/float64(rows), "index-bytes/row")
				b.ReportMetric(float64(parts), "partitions")
			})
		}
	}
}
