package postgres_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// passStatements is a pgx tracer that times the statements a cleaner pass
// sends, those whose context carries passMark, so that a benchmark can
// tell which of them the claims that overlap it pay for. A batch is timed
// whole, under the labels of its statements.
type passStatements struct {
	start time.Time
	mu    sync.Mutex
	spans []labeledSpan
}

// labeledSpan is a statement's span, from the run's start.
type labeledSpan struct {
	label string
	span
}

// passMark marks the context of a pass's statements (withPassMark).
type passMark struct{}

// statementStartKey carries a statement's start from its TraceStart to
// its TraceEnd.
type statementStartKey struct{}

type statementStart struct {
	label string
	from  time.Duration
}

func withPassMark(ctx context.Context) context.Context {
	return context.WithValue(ctx, passMark{}, true)
}

func (p *passStatements) begin(ctx context.Context, label string) context.Context {
	if ctx.Value(passMark{}) == nil {
		return ctx
	}
	if label == "" {
		label = "BEGIN, COMMIT, SET LOCAL"
	}
	return context.WithValue(ctx, statementStartKey{}, statementStart{label, time.Since(p.start)})
}

func (p *passStatements) end(ctx context.Context) {
	s, ok := ctx.Value(statementStartKey{}).(statementStart)
	if !ok {
		return
	}
	to := time.Since(p.start)
	p.mu.Lock()
	p.spans = append(p.spans, labeledSpan{s.label, span{s.from, to}})
	p.mu.Unlock()
}

func (p *passStatements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	return p.begin(ctx, statementLabel(data.SQL))
}

func (p *passStatements) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	p.end(ctx)
}

func (p *passStatements) TraceBatchStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	var labels []string
	for _, q := range data.Batch.QueuedQueries {
		if l := statementLabel(q.SQL); l != "" {
			labels = append(labels, l)
		}
	}
	return p.begin(ctx, strings.Join(labels, " + "))
}

func (p *passStatements) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (p *passStatements) TraceBatchEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchEndData) {
	p.end(ctx)
}

// statementLabels name a pass's statements by what they do; the first that
// matches names it. Transaction control and SET LOCAL are left out of a
// batch's name ("").
var statementLabels = []struct {
	re    *regexp.Regexp
	label string
}{
	{regexp.MustCompile(`^(?i)(begin|commit|rollback|set local)`), ""},
	{regexp.MustCompile(`pg_locks`), "older transactions?"},
	{regexp.MustCompile(`pg_inherits`), "list partitions"},
	{regexp.MustCompile(`pg_(try_)?advisory`), "advisory lock"},
	{regexp.MustCompile(`^CREATE TABLE`), "CREATE TABLE"},
	{regexp.MustCompile(`^CREATE UNIQUE INDEX`), "CREATE INDEX"},
	{regexp.MustCompile(`ATTACH PARTITION`), "ATTACH"},
	{regexp.MustCompile(`DETACH PARTITION .* CONCURRENTLY`), "DETACH CONCURRENTLY"},
	{regexp.MustCompile(`DETACH PARTITION .* FINALIZE`), "DETACH FINALIZE"},
	{regexp.MustCompile(`^COMMENT ON`), "COMMENT"},
	{regexp.MustCompile(`^DROP TABLE`), "DROP TABLE"},
	{regexp.MustCompile(`^SELECT pg_relation_size`), "partition size"},
	{regexp.MustCompile(`^SELECT max\(greatest`), "live rows"},
	{regexp.MustCompile(`^SELECT count\(\*\)`), "count(*)"},
	{regexp.MustCompile(`^SELECT scope, key`), "filter: keys"},
	{regexp.MustCompile(`^INSERT INTO .*key_filters`), "filter: store"},
	{regexp.MustCompile(`^DELETE FROM .*key_filters`), "filter: delete"},
	{regexp.MustCompile(`^SELECT partition, lower_bound`), "filter: load"},
	{regexp.MustCompile(`^SELECT partition FROM`), "filter: names"},
	{regexp.MustCompile(`(?s)^WITH gone AS \(\s*DELETE`), "DELETE batch"},
}

// dropStatement is the label of the batch that drops a detached partition
// with its key filter (dropDetached).
const dropStatement = "DROP TABLE + filter: delete"

// listStatement is the label of the batch that starts a pass of the
// partitioned layout (listWithFilters).
const listStatement = "list partitions + filter: names"

// taken returns how many of each statement the passes sent since the last
// call, and forgets them.
func (p *passStatements) taken() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := map[string]int{}
	for _, s := range p.spans {
		n[s.label]++
	}
	p.spans = nil
	return n
}

func statementLabel(sql string) string {
	sql = strings.TrimSpace(sql)
	for _, l := range statementLabels {
		if l.re.MatchString(sql) {
			return l.label
		}
	}
	return strings.Join(strings.Fields(sql[:min(len(sql), 40)]), " ")
}

// byStatement is, for each label, how many times a pass sent it, its mean
// time, and the p99 of the claims that overlap it, most overlapped
// first, on one line.
func (p *passStatements) byStatement(claims []span) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	type row struct {
		label    string
		spans    []span
		total    time.Duration
		overlaps []time.Duration
	}
	rows := map[string]*row{}
	for _, s := range p.spans {
		r := rows[s.label]
		if r == nil {
			r = &row{label: s.label}
			rows[s.label] = r
		}
		r.spans = append(r.spans, s.span)
		r.total += s.to - s.from
	}
	var sorted []*row
	for _, r := range rows {
		for _, c := range claims {
			if overlaps(c, r.spans) {
				r.overlaps = append(r.overlaps, c.to-c.from)
			}
		}
		sorted = append(sorted, r)
	}
	slices.SortFunc(sorted, func(a, b *row) int { return len(b.overlaps) - len(a.overlaps) })
	var line strings.Builder
	for _, r := range sorted {
		fmt.Fprintf(&line, "%s: %d, mean %v, %d claims, p99 %v; ", r.label, len(r.spans),
			(r.total / time.Duration(len(r.spans))).Round(10*time.Microsecond), len(r.overlaps), percentile(r.overlaps, 0.99).Round(10*time.Microsecond))
	}
	return line.String()
}
