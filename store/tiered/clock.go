package tiered

import "sync"

// The store reads time from the process's monotonic clock, as nanoseconds
// since it was made ("local" times below), so that a step of the wall
// clock moves no deadline. PostgreSQL (now()) and Redis (TTLs) judge
// expiry by clocks of their own; a remoteClock relates one of them to the
// local clock by samples whose round trip bounds the error:
//
//	a remote time r, read between local send s and local receive e, gives
//	remote − local in [r − e, r − s] at that moment.
//
// Between samples two clocks drift apart by at most maxDrift (500 ppm, the
// most NTP slews a clock; quartz alone stays within 100 ppm), so the bounds
// widen with the sample's age. Stepping a clock (by hand, or NTP at
// startup) is outside this assumption: ClockMargin is the only room left.

// driftDivisor is 1/maxDrift: a bound widens by age/driftDivisor.
const driftDivisor = 2000

// offset is one sample: remote − local lay in [lo, hi] at local time at.
type offset struct {
	lo, hi, at int64
}

// sampleOffset is the offset that remote time r, read between local send
// and recv, shows. All three are nanoseconds.
func sampleOffset(r, send, recv int64) offset {
	return offset{lo: r - recv, hi: r - send, at: recv}
}

// bounds are o's bounds at local time now, widened by the drift since.
func (o offset) bounds(now int64) (lo, hi int64) {
	d := max(now-o.at, 0) / driftDivisor
	return o.lo - d, o.hi + d
}

// remoteClock keeps the samples that bound remote − local most tightly
// from below and from above, each widened by its age.
type remoteClock struct {
	mu     sync.Mutex
	ok     bool
	lo, hi offset // the samples giving the best lower and upper bound
	last   int64  // local time of the newest sample
}

// observe adds a sample.
func (c *remoteClock) observe(s offset) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.ok {
		c.ok, c.lo, c.hi, c.last = true, s, s, s.at
		return
	}
	c.last = max(c.last, s.at)
	if lo, _ := c.lo.bounds(s.at); s.lo > lo {
		c.lo = s
	}
	if _, hi := c.hi.bounds(s.at); s.hi < hi {
		c.hi = s
	}
}

// lower returns a lower bound of remote − local at local time now.
func (c *remoteClock) lower(now int64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	lo, _ := c.lo.bounds(now)
	return lo, c.ok
}

// upper returns an upper bound of remote − local at local time now.
func (c *remoteClock) upper(now int64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, hi := c.hi.bounds(now)
	return hi, c.ok
}

// estimate returns the middle of the best bounds, for times that decide
// nothing (the times of a record written through).
func (c *remoteClock) estimate(now int64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	lo, _ := c.lo.bounds(now)
	_, hi := c.hi.bounds(now)
	return lo + (hi-lo)/2, c.ok
}

// age is how long ago, in local nanoseconds, the newest sample was taken;
// ok is false without one.
func (c *remoteClock) age(now int64) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return now - c.last, c.ok
}

// reset forgets every sample.
func (c *remoteClock) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ok = false
}
