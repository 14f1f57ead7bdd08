package storetest

import (
	"sync/atomic"
	"time"
)

// Clock is a manual clock for stores that take their time from a function.
// It is safe for concurrent use. Pass Clock.Now to the store and
// Clock.Advance as the Harness's Advance.
type Clock struct {
	start   time.Time
	elapsed atomic.Int64 // nanoseconds since start
}

// NewClock returns a clock that reads start until it is advanced.
func NewClock(start time.Time) *Clock {
	return &Clock{start: start}
}

// Now returns the clock's current time.
func (c *Clock) Now() time.Time {
	return c.start.Add(time.Duration(c.elapsed.Load()))
}

// Advance moves the clock forward by d. It panics on a negative d: stores
// assume their clock never runs backwards.
func (c *Clock) Advance(d time.Duration) {
	if d < 0 {
		panic("storetest: Clock.Advance with a negative duration")
	}
	c.elapsed.Add(int64(d))
}
