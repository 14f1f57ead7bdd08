package main

import (
	"context"
	"testing"
	"time"

	"github.com/oncemill/oncemill/examples/internal/exampletest"
)

// TestPipeline runs the program (gochannel and the memory store, both in
// process) and checks what it printed: each order shipped at most once, and
// each stage doing its part.
func TestPipeline(t *testing.T) {
	out := &exampletest.Log{}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := run(ctx, out); err != nil {
		exampletest.Fatalf(t, out, "run: %v", err)
	}
	for _, c := range []struct {
		parts []string
		want  int
	}{
		// The business effect: once per order that could ship.
		{[]string{"order-1: shipped 1 × book"}, 1},
		{[]string{"order-3: shipped 2 × lamp"}, 1},
		{[]string{": shipped"}, 2},
		{[]string{"shipped order-1 1 time(s)"}, 1},
		{[]string{"shipped order-3 1 time(s)"}, 1},
		// A duplicate: executed once, then replayed.
		{[]string{"order-1: executed"}, 1},
		{[]string{"order-1: replayed"}, 1},
		// An invalid message: refused and dead-lettered, never stored.
		{[]string{"order-2: invalid", "quantity 0"}, 1},
		{[]string{"dead letter: order-2, invalid on attempt 0"}, 1},
		// A transient failure: retried in process, then shipped.
		{[]string{"retry: try 1 failed (warehouse API timed out)"}, 1},
		{[]string{"retry:"}, 1},
		{[]string{"order-3: executed"}, 1},
		// A permanent failure: cached and dead-lettered once; the duplicate
		// gets the cached failure without running.
		{[]string{"order-4: cached_failure (", "out of stock"}, 1},
		{[]string{"order-4: cached_failure_replayed"}, 1},
		{[]string{"dead letter: order-4, cached_failure on attempt 1", "out of stock"}, 1},
		{[]string{"dead letter:"}, 2},
		// The breaker saw one transient failure: it stays closed.
		{[]string{"circuit"}, 0},
	} {
		if got := out.Count(c.parts...); got != c.want {
			t.Errorf("%d lines with %q, want %d", got, c.parts, c.want)
		}
	}
	if t.Failed() {
		t.Logf("the program printed:\n%s", out)
	}
}
