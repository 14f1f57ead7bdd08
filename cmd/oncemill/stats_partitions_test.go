package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// stats lists the partitions of a table of the partitioned layout, oldest
// first, with their rows.
func TestStatsShowsPartitions(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	st, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1, Layout: postgres.LayoutPartitioned})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := st.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"a", "b", "c"} {
		if _, err := st.ClaimLease(ctx, store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: time.Minute}); err != nil {
			t.Fatal(err)
		}
	}
	v := jsonObject[statsView](t, runCLI(t, nil, append(postgresFlags(schema), "--json", "stats")...).mustCode(t, exitOK))
	var rows int64
	for _, p := range v.Partitions {
		rows += p.Rows
	}
	if len(v.Partitions) < 2 || rows != 3 || v.Partitions[0].From == "" || v.Partitions[0].From >= v.Partitions[1].From {
		t.Fatalf("stats partitions: %+v; want the current one and those ahead, oldest first, holding the 3 records", v.Partitions)
	}
	out := runCLI(t, nil, append(postgresFlags(schema), "stats")...).mustCode(t, exitOK).stdout
	for _, want := range []string{"PARTITION", "ROWS", v.Partitions[0].Name} {
		if !strings.Contains(out, want) {
			t.Errorf("stats table lacks %q:\n%s", want, out)
		}
	}
}

// migrate --postgres-layout=partitioned creates a partitioned table, and
// converts one of the DELETE layout, saying so; without the flag, migrate
// refuses a partitioned table, naming the layout.
func TestMigratePartitioned(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	for _, existing := range []bool{false, true} {
		schema := testenv.Schema(t, pool)
		flags := postgresFlags(schema)
		if existing {
			runCLI(t, nil, append(flags, "migrate")...).mustCode(t, exitOK)
		}
		m := jsonObject[migration](t, runCLI(t, nil, append(flags, "--postgres-layout=partitioned", "--json", "migrate")...).mustCode(t, exitOK))
		if from := map[bool]string{false: "", true: "delete"}[existing]; !m.Changed || m.FromLayout != from || m.ToLayout != "partitioned" {
			t.Fatalf("migrate --postgres-layout=partitioned (existing table %v): %+v; want a change from layout %q to partitioned", existing, m, from)
		}
		st, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		parts, err := st.Partitions(t.Context())
		st.Close()
		if err != nil || len(parts) == 0 || parts[0].From.IsZero() != existing {
			t.Fatalf("partitions after migrate --postgres-layout=partitioned (existing table %v): %+v, %v", existing, parts, err)
		}
		if existing {
			// The same conversion, in words, on a table of its own.
			other := postgresFlags(testenv.Schema(t, pool))
			runCLI(t, nil, append(other, "migrate")...).mustCode(t, exitOK)
			r := runCLI(t, nil, append(other, "--postgres-layout=partitioned", "migrate")...).mustCode(t, exitOK)
			if !strings.Contains(r.stdout, "from the delete layout to the partitioned layout") {
				t.Fatalf("the conversion's line: %q; want it to name both layouts", r.stdout)
			}
		}
		r := runCLI(t, nil, append(flags, "migrate")...)
		if r.code == exitOK || !strings.Contains(r.stderr, "LayoutPartitioned") {
			t.Fatalf("migrate of a partitioned table without the flag: exit %d, %q; want a refusal naming the layout", r.code, r.stderr)
		}
	}
}

// On a partitioned table whose records sit in two partitions (half of
// them claimed hours ago, in an old one), list pages through all of them in
// key order, inspect finds one in the old partition by key and by message
// UUID, and purge deletes them from both partitions, which stay.
func TestCommandsAcrossPartitions(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	st, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1, Layout: postgres.LayoutPartitioned})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	qualified := pgx.Identifier{schema, "oncemill_records"}.Sanitize()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(t.Context(), sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(fmt.Sprintf("CREATE TABLE %s PARTITION OF %s FOR VALUES FROM (date_trunc('hour', now()) - interval '4 hours') TO (date_trunc('hour', now()) - interval '3 hours')",
		pgx.Identifier{schema, "old"}.Sanitize(), qualified))
	const n = 10
	for i := range n {
		key := fmt.Sprintf("k%02d", i)
		res, err := st.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: key, LeaseDuration: time.Minute, Retain: time.Hour, MessageUUID: "uuid-" + key})
		if err != nil || res.Decision != store.DecisionExecute {
			t.Fatalf("ClaimLease %s = %+v, %v", key, res, err)
		}
		if err := st.Complete(t.Context(), res.Claim, store.Completion{Status: store.StatusSucceeded, Result: []byte(key), TTL: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	// The odd keys move to the old partition (an UPDATE of the partition
	// key moves the row).
	exec("UPDATE " + qualified + " SET claimed_at = date_trunc('hour', now()) - interval '210 minutes' WHERE right(key, 1)::int % 2 = 1")
	var inOld int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+pgx.Identifier{schema, "old"}.Sanitize()).Scan(&inOld); err != nil || inOld != n/2 {
		t.Fatalf("%d rows in the old partition, %v; want %d", inOld, err, n/2)
	}
	flags := append(postgresFlags(schema), "--postgres-layout=partitioned")
	cli := func(code int, args ...string) cliRun {
		t.Helper()
		return runCLI(t, nil, append(append([]string{}, flags...), args...)...).mustCode(t, code)
	}

	listed := jsonLines[recordView](t, cli(exitOK, "--json", "list", "--scope", "s", "--limit", "3", "--all"))
	if len(listed) != n {
		t.Fatalf("list --limit 3 --all printed %d records; want %d: %+v", len(listed), n, listed)
	}
	for i, r := range listed {
		if want := fmt.Sprintf("k%02d", i); r.Key != want || r.Status != "succeeded" {
			t.Fatalf("list record %d: %+v; want %s, succeeded, in key order", i, r, want)
		}
	}
	if v := jsonObject[inspectView](t, cli(exitOK, "--json", "inspect", "--scope=s", "--key=k03")); v.Status != "succeeded" || v.MessageUUID != "uuid-k03" {
		t.Fatalf("inspect of a record in the old partition: %+v", v)
	}
	if v := jsonLines[inspectView](t, cli(exitOK, "--json", "inspect", "--uuid", "uuid-k05")); len(v) != 1 || v[0].Key != "k05" {
		t.Fatalf("inspect --uuid of a record in the old partition: %+v", v)
	}
	r := cli(exitOK, "--json", "purge", "--scope", "s", "--dry-run=false", "--batch", "4")
	lines := jsonLines[purgeTestLine](t, r)
	if sum := lines[len(lines)-1]; sum.Action != "summary" || sum.Deleted != n || sum.Matched != n {
		t.Fatalf("purge summary: %+v; want all %d deleted", sum, n)
	}
	var left int
	if err := pool.QueryRow(t.Context(), "SELECT count(*) FROM "+qualified).Scan(&left); err != nil || left != 0 {
		t.Fatalf("%d records left after purge, %v", left, err)
	}
	parts, err := st.Partitions(t.Context())
	if err != nil || len(parts) < 2 || parts[0].Name != "old" {
		t.Fatalf("partitions after purge: %+v, %v; want the old one and the current ones, still there", parts, err)
	}
}
