package worker

// The tally of what oncemill decided for each delivery.

import (
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/oncemill/oncemill/pipeline"
)

// Tally counts the outcome of every delivery, from the events oncemill
// reports (Record is its event handler).
type Tally struct {
	outcomes [pipeline.OutcomeHeldBack + 1]atomic.Int64 // index 0: an outcome this program does not know
	acked    atomic.Int64
}

// Record counts ev.
func (t *Tally) Record(ev pipeline.Event) {
	o := ev.Outcome
	if o < 0 || int(o) >= len(t.outcomes) {
		o = 0
	}
	t.outcomes[o].Add(1)
	if ev.Outcome.Acked() {
		t.acked.Add(1)
	}
}

// Count is the number of deliveries with outcome o.
func (t *Tally) Count(o pipeline.Outcome) int64 { return t.outcomes[o].Load() }

// Acked is the number of deliveries whose outcome acks them.
func (t *Tally) Acked() int64 { return t.acked.Load() }

// Replays counts deliveries answered from a stored success (the handler was
// not called; the stored settlement was returned again).
func (t *Tally) Replays() int64 { return t.Count(pipeline.OutcomeReplayed) }

// CachedFailures counts deliveries acked as a cached failure: the first time
// (FailureCached) or replayed to a duplicate (FailureReplayed).
func (t *Tally) CachedFailures() int64 {
	return t.Count(pipeline.OutcomeCachedFailure) + t.Count(pipeline.OutcomeCachedFailureReplayed)
}

// Deliveries is the number of deliveries counted.
func (t *Tally) Deliveries() int64 {
	var n int64
	for i := range t.outcomes {
		n += t.outcomes[i].Load()
	}
	return n
}

// Outcomes says the count of each outcome that occurred, as
// "executed=3 replayed=1", in the order of the constants.
func (t *Tally) Outcomes() string {
	var parts []string
	for o := pipeline.OutcomeExecuted; o <= pipeline.OutcomeHeldBack; o++ {
		if n := t.Count(o); n > 0 {
			parts = append(parts, fmt.Sprintf("%s=%d", o, n))
		}
	}
	return strings.Join(parts, " ")
}

// LogAttrs are the counts for a log record: deliveries, then each outcome.
func (t *Tally) LogAttrs() []any {
	attrs := []any{"deliveries", t.Deliveries()}
	for o := pipeline.OutcomeExecuted; o <= pipeline.OutcomeHeldBack; o++ {
		attrs = append(attrs, o.String(), t.Count(o))
	}
	return attrs
}
