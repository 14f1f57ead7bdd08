package worker

// The result of a run: the numbers, the summary line, and the checks.

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Summary is what a run reports.
type Summary struct {
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

	Doubled   []string // the first few payments charged more than once
	Completed bool
	Elapsed   time.Duration
}

// Audit checks the ledger counts against the plan: DoubleEffects is the
// number of extra charges, the sum over commands of (charges-1) where
// charges > 1; Lost is the number of valid commands never charged. It also
// sets MsgsPerSec from Deliveries and Elapsed.
func (s *Summary) Audit(counts map[string]int, plan *Plan) {
	s.DoubleEffects, s.Lost, s.Doubled = 0, 0, nil
	for i, c := range plan.Commands {
		n := counts[c.PaymentID]
		if n > 1 {
			s.DoubleEffects += n - 1
			if len(s.Doubled) < 5 {
				s.Doubled = append(s.Doubled, fmt.Sprintf("%s x%d", c.PaymentID, n))
			}
		}
		if n == 0 && plan.Valid(i) {
			s.Lost++
		}
	}
	if secs := s.Elapsed.Seconds(); secs > 0 {
		s.MsgsPerSec = float64(s.Deliveries) / secs
	}
}

// Line is the summary line; its keys and order are fixed.
func (s *Summary) Line() string {
	return fmt.Sprintf("summary: published=%d deliveries=%d unique=%d effects=%d replays=%d cached_failures=%d double_effects=%d lost=%d msgs_per_sec=%.0f",
		s.Published, s.Deliveries, s.Unique, s.Effects, s.Replays, s.CachedFailures, s.DoubleEffects, s.Lost, s.MsgsPerSec)
}

// Problems lists every failed check; none means the run passed.
func (s *Summary) Problems() []string {
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
	return out
}

// ExitCode reports what went wrong on stderr, one "<prog>: FAIL:" line per
// problem (err first, when not nil), and returns the process's exit code:
// 0 when there is nothing to report, else 1.
func ExitCode(stderr io.Writer, prog string, err error, problems ...string) int {
	if err != nil {
		problems = append([]string{err.Error()}, problems...)
	}
	for _, p := range problems {
		fmt.Fprintf(stderr, "%s: FAIL: %s\n", prog, p)
	}
	if len(problems) > 0 {
		return 1
	}
	return 0
}
