package main

import (
	"context"
	"strings"
	"testing"
	"time"

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
// converts one of the DELETE layout; without the flag, migrate refuses a
// partitioned table, naming the layout.
func TestMigratePartitioned(t *testing.T) {
	t.Parallel()
	pool := testenv.Pool(t)
	for _, existing := range []bool{false, true} {
		schema := testenv.Schema(t, pool)
		flags := postgresFlags(schema)
		if existing {
			runCLI(t, nil, append(flags, "migrate")...).mustCode(t, exitOK)
		}
		runCLI(t, nil, append(flags, "--postgres-layout=partitioned", "migrate")...).mustCode(t, exitOK)
		st, err := postgres.New(pool, postgres.Options{Schema: schema, CleanupInterval: -1})
		if err != nil {
			t.Fatal(err)
		}
		parts, err := st.Partitions(t.Context())
		st.Close()
		if err != nil || len(parts) == 0 || parts[0].From.IsZero() != existing {
			t.Fatalf("partitions after migrate --postgres-layout=partitioned (existing table %v): %+v, %v", existing, parts, err)
		}
		r := runCLI(t, nil, append(flags, "migrate")...)
		if r.code == exitOK || !strings.Contains(r.stderr, "LayoutPartitioned") {
			t.Fatalf("migrate of a partitioned table without the flag: exit %d, %q; want a refusal naming the layout", r.code, r.stderr)
		}
	}
}
