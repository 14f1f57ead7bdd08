package idempotency

import (
	"sync/atomic"
	"time"
)

// heartbeats keeps the leases of one stage's running handlers alive. A
// handler takes a slot with one atomic operation and gives it back with
// another: no timer, no lock, no allocation. One goroutine per stage, alive
// only while some handler holds a slot, wakes every tick and starts a beat
// for each execution whose beat is due. So the handlers that end before
// their first beat is due (nearly all of them) cost no runtime timer, and no
// handler waits on another's mutex.
//
// When every slot is taken, an execution falls back to a timer of its own.
type heartbeats struct {
	slots [heartbeatSlots]atomic.Pointer[execution]
	next  atomic.Uint32 // where the next search for a free slot starts
	// ticks counts the scanner's ticks; an execution is due when ticks has
	// moved ticksPerBeat past the tick it registered at.
	ticks        atomic.Int64
	tick         time.Duration
	ticksPerBeat int64
	scanning     atomic.Bool // the scanner goroutine is alive
}

// heartbeatSlots bounds the handlers one stage beats for without timers of
// their own: far more than a router runs at once on one stage.
const heartbeatSlots = 256

// newHeartbeats beats every interval, for leases of length lease. The tick
// is a quarter of the interval, or of the time a beat may be late before the
// lease runs out, whichever is shorter, so a beat is at most that late.
func newHeartbeats(interval, lease time.Duration) *heartbeats {
	tick := max(min(interval, lease-interval)/4, time.Millisecond)
	return &heartbeats{tick: tick, ticksPerBeat: max(int64(interval/tick), 1)}
}

// add registers e for beats. It reports false when every slot is taken.
func (h *heartbeats) add(e *execution) bool {
	e.beatAt.Store(h.ticks.Load() + h.ticksPerBeat)
	start := h.next.Add(1)
	for i := range uint32(heartbeatSlots) {
		slot := (start + i) % heartbeatSlots
		if h.slots[slot].CompareAndSwap(nil, e) {
			e.slot = int32(slot)
			if !h.scanning.Load() && h.scanning.CompareAndSwap(false, true) {
				go h.scan()
			}
			return true
		}
	}
	return false
}

// remove gives e's slot back: no beat starts for e afterwards.
func (h *heartbeats) remove(e *execution) {
	h.slots[e.slot].Store(nil)
}

// scan is the stage's beat goroutine. It exits after a tick that finds no
// slot taken; add starts it again.
func (h *heartbeats) scan() {
	t := time.NewTicker(h.tick)
	defer t.Stop()
	for range t.C {
		now := h.ticks.Add(1)
		busy := false
		for i := range h.slots {
			e := h.slots[i].Load()
			if e == nil {
				continue
			}
			busy = true
			// One beat at a time: a store slower than the heartbeat must not
			// pile beats up behind the one in flight.
			if due := e.beatAt.Load(); now >= due && e.beating.CompareAndSwap(false, true) {
				e.beatAt.Store(now + h.ticksPerBeat)
				go func() {
					e.beat()
					e.beating.Store(false)
				}()
			}
		}
		if !busy {
			h.scanning.Store(false)
			// A handler that registered after the scan saw its slot empty
			// would have found scanning still true: look once more.
			if !h.anyBusy() || !h.scanning.CompareAndSwap(false, true) {
				return
			}
		}
	}
}

func (h *heartbeats) anyBusy() bool {
	for i := range h.slots {
		if h.slots[i].Load() != nil {
			return true
		}
	}
	return false
}
