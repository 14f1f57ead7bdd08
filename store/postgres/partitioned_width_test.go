package postgres_test

import (
	"regexp"
	"testing"
	"time"

	"github.com/oncemill/oncemill/internal/testenv"
	"github.com/oncemill/oncemill/store"
	"github.com/oncemill/oncemill/store/postgres"
)

// A store given partitions of seconds (the benchmarks' WithPartitionWidth)
// creates them that wide, named to the second, and drops one whose rows
// have all gone: what BenchmarkPartitionedFlatAsItGrows and
// BenchmarkPartitionedNoBloat rely on to see retentions turn over in
// minutes.
func TestPartitionedWidthOfSeconds(t *testing.T) {
	t.Parallel()
	const width = 2 * time.Second
	pool := testenv.Pool(t)
	schema := testenv.Schema(t, pool)
	s := newPartitioned(t, pool, schema, postgres.WithPartitionWidth(postgres.Options{Retention: 10 * time.Second}, width))
	if _, ran, err := s.CleanupPass(t.Context()); err != nil || !ran {
		t.Fatalf("CleanupPass = %v, %v", ran, err)
	}
	parts := partitionsOf(t, pool, schema)
	if len(parts) < 2 {
		t.Fatalf("partitions %+v; want the current one and those ahead", parts)
	}
	named := regexp.MustCompile(`^` + partitionedTable + `_\d{14}$`)
	for _, p := range parts {
		if p.upper.Sub(p.lower) != width || !named.MatchString(p.name) || p.name != partitionedTable+"_"+p.lower.UTC().Format("20060102150405") {
			t.Fatalf("partition %+v; want %v wide, named by its lower bound to the second", p, width)
		}
	}

	res, err := s.ClaimLease(t.Context(), store.LeaseRequest{Scope: "s", Key: "k", LeaseDuration: 100 * time.Millisecond})
	if err != nil || res.Decision != store.DecisionExecute {
		t.Fatalf("ClaimLease = %+v, %v", res, err)
	}
	if err := s.Complete(t.Context(), res.Claim, store.Completion{Status: store.StatusSucceeded, TTL: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	first := rowsOf(t, pool, schema, "s", "k")
	if len(first) != 1 {
		t.Fatalf("the key's rows are in %v; want one partition", first)
	}
	removed := 0
	testenv.WaitFor(t, 30*time.Second, "the key's partition to be dropped", func() bool {
		n, _, err := s.CleanupPass(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		removed += n
		return len(rowsOf(t, pool, schema, "s", "k")) == 0
	})
	if removed != 1 {
		t.Fatalf("the passes removed %d rows; want the key's one", removed)
	}
	for _, p := range partitionsOf(t, pool, schema) {
		if schema+"."+p.name == first[0] || p.name == first[0] {
			t.Fatalf("partition %s, which held the key, is still there", first[0])
		}
	}
}
