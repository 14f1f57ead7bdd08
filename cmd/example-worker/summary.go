package main

// The result of a run: the numbers, the summary line, and the checks.

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/oncemill/oncemill/pipeline"
)

// summary is what a run reports.
type summary struct {
	// The summary line, in its order.
	Published      int     // unique commands published
	Deliveries     int     // messages published to the handlers, duplicates included
	Unique         int     // distinct keys among them (should equal Published)
	Effects        int     // ledger entries
	Replays        int64   // deliveries answered from a stored success
	CachedFailures int64   // deliveries acked as a cached failure, first time or replayed
	DoubleEffects  int     // extra charges: sum over commands of (charges-1) where charges > 1
	Lost           int     // valid commands never charged
	MsgsPerSec     float64 // Deliveries / Elapsed

	// Details.
	Doubled        []string // the first few payments charged more than once
	Commands       int      // commands planned (--count)
	Invalid        int      // commands that must fail permanently and never be charged
	Planned        int      // deliveries planned
	Completed      bool
	Elapsed        time.Duration
	AckedByRouter  int   // deliveries the handlers acknowledged, as the router saw it, the broker's own redeliveries included
	AckedByEvents  int64 // deliveries the events say were acknowledged
	Outcomes       map[pipeline.Outcome]int64
	Takeovers      int64
	InProgressKeys int // keys a delivery found held by another live lease
	Produced       int // settlements returned by handlers
	Settled        int // settlements received on the settlements topic
	SettledUUIDs   int // distinct settlement UUIDs
	LogErrors      int64
	Faults         faultCounts
	Idempotent     bool
}

// line is the summary line; its keys and order are fixed.
func (s summary) line() string {
	return fmt.Sprintf("summary: published=%d deliveries=%d unique=%d effects=%d replays=%d cached_failures=%d double_effects=%d lost=%d msgs_per_sec=%.0f",
		s.Published, s.Deliveries, s.Unique, s.Effects, s.Replays, s.CachedFailures, s.DoubleEffects, s.Lost, s.MsgsPerSec)
}

// problems lists every failed check; none means the run passed.
func (s summary) problems() []string {
	var out []string
	if s.DoubleEffects > 0 {
		out = append(out, fmt.Sprintf("double_effects=%d: payments were charged more than once (%s)", s.DoubleEffects, strings.Join(s.Doubled, ", ")))
	}
	if s.Lost > 0 {
		out = append(out, fmt.Sprintf("lost=%d: valid payments were never charged", s.Lost))
	}
	if s.Unique != s.Published {
		out = append(out, fmt.Sprintf("unique=%d but published=%d: the key generator does not map each command to exactly one key", s.Unique, s.Published))
	}
	if s.Completed && s.Idempotent && s.AckedByEvents != int64(s.AckedByRouter) {
		out = append(out, fmt.Sprintf("oncemill events report %d acknowledged deliveries but the router acknowledged %d", s.AckedByEvents, s.AckedByRouter))
	}
	return out
}

// write prints the details and, last, the summary line.
func (s summary) write(w io.Writer) {
	mode := "oncemill"
	if !s.Idempotent {
		mode = "no idempotency (baseline)"
	}
	o := s.Outcomes
	fmt.Fprintf(w, "mode: %s, elapsed %v, completed=%t\n", mode, s.Elapsed.Round(time.Millisecond), s.Completed)
	fmt.Fprintf(w, "faults: invalid=%d transient=%d stall=%d redeliver=%d resend=%d concurrent=%d\n",
		s.Faults.invalid, s.Faults.transient, s.Faults.stall, s.Faults.redeliver, s.Faults.resend, s.Faults.concurrent)
	fmt.Fprintf(w, "outcomes: executed=%d replayed=%d failure_cached=%d failure_replayed=%d released=%d in_progress_nacked=%d rejected=%d store_failed=%d takeovers=%d in_progress_keys=%d\n",
		o[pipeline.OutcomeExecuted], o[pipeline.OutcomeReplayed], o[pipeline.OutcomeFailureCached], o[pipeline.OutcomeFailureReplayed], o[pipeline.OutcomeReleased],
		o[pipeline.OutcomeHeldKeyNacked], o[pipeline.OutcomeRejected], o[pipeline.OutcomeStoreFailed], s.Takeovers, s.InProgressKeys)
	fmt.Fprintf(w, "settlements: produced=%d received=%d distinct=%d; log_errors=%d\n", s.Produced, s.Settled, s.SettledUUIDs, s.LogErrors)
	fmt.Fprintln(w, s.line())
}
