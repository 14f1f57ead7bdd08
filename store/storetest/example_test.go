package storetest_test

import (
	"fmt"
	"time"

	"github.com/oncemill/oncemill/store/memory"
	"github.com/oncemill/oncemill/store/storetest"
)

// A store that reads its time from a function is tested on a manual clock:
// the harness's Advance moves it, so lease expiry and TTLs need no sleeping.
// In a test, pass the harness to storetest.Run:
//
//	storetest.Run(t, func(t *testing.T) storetest.Harness {
//		clock := storetest.NewClock(time.Now())
//		st, _ := memory.New(memory.Options{Now: clock.Now, CleanupInterval: -1})
//		t.Cleanup(func() { st.Close() })
//		return storetest.Harness{Store: st, Advance: clock.Advance}
//	})
func ExampleClock() {
	clock := storetest.NewClock(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	st, err := memory.New(memory.Options{Now: clock.Now, CleanupInterval: -1})
	if err != nil {
		panic(err)
	}
	defer st.Close()
	h := storetest.Harness{Store: st, Advance: clock.Advance}

	h.Advance(90 * time.Second)
	fmt.Println(clock.Now().Format(time.TimeOnly))
	// Output: 12:01:30
}
