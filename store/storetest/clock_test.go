package storetest_test

import (
	"sync"
	"testing"
	"time"

	"github.com/oncemill/oncemill/store/storetest"
)

func TestClock(t *testing.T) {
	t.Parallel()
	start := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	c := storetest.NewClock(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now() = %v, want %v", got, start)
	}

	var wg sync.WaitGroup
	for range 10 {
		wg.Go(func() {
			for range 100 {
				c.Advance(time.Second)
				_ = c.Now()
			}
		})
	}
	wg.Wait()

	if got, want := c.Now(), start.Add(1000*time.Second); !got.Equal(want) {
		t.Fatalf("after 1000 concurrent Advance(1s): Now() = %v, want %v", got, want)
	}
}

func TestClockAdvanceNegativePanics(t *testing.T) {
	t.Parallel()
	defer func() {
		if recover() == nil {
			t.Fatal("Advance(-1s) did not panic")
		}
	}()
	storetest.NewClock(time.Now()).Advance(-time.Second)
}
