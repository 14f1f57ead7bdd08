package deploy

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

const (
	dashboardFile = "grafana/oncemill.json"
	rulesFile     = "prometheus/oncemill-rules.yml"
)

// expr is one PromQL expression and where it is written.
type expr struct {
	where, query string
}

// Every expression of the dashboard and the rules names only series,
// labels and label values a receiver exports through the OpenTelemetry
// Prometheus exporter; the rules parse as Prometheus rules.
func TestDashboardAndRulesNameExportedMetrics(t *testing.T) {
	series := exportedSeries(t)
	exprs := append(dashboardExprs(t), ruleExprs(t)...)
	t.Logf("%d expressions in %s and %s", len(exprs), dashboardFile, rulesFile)
	for _, e := range exprs {
		for _, err := range check(e.query, series) {
			t.Errorf("%s: %v\n\t%s", e.where, err, e.query)
		}
	}

	// The checker reports what it is meant to: each case names one thing
	// the library does not export.
	for _, c := range []struct{ query, want string }{
		{`sum(rate(oncemill_replays_total[5m]))`, `metric oncemill_replays_total is not exported`},
		{`oncemill_store_duration_seconds`, `metric oncemill_store_duration_seconds is not exported`}, // a histogram is scraped as _bucket, _sum, _count
		{`oncemill_decisions_total{scope="payments"}`, `oncemill_decisions_total has no label scope`},
		{`oncemill_dead_letters_total{handler=~".*"}`, `oncemill_dead_letters_total has no label handler`},
		{`sum by (key) (rate(oncemill_outcomes_total[5m]))`, `oncemill_outcomes_total has no label key`},
		{`sum by (le) (rate(oncemill_store_duration_seconds_sum[5m]))`, `oncemill_store_duration_seconds_sum has no label le`},
		{`rate(oncemill_decisions_total{decision="replayed"}[5m])`, `oncemill_decisions_total{decision} never has the value "replayed"`},
		{`rate(oncemill_outcomes_total{outcome=~"executed|nacked"}[5m])`, `oncemill_outcomes_total{outcome} never has the value "nacked"`},
		{`rate(oncemill_decisions_total[5m]) / on (breaker) oncemill_breaker_state`, `oncemill_decisions_total has no label breaker`},
		{`rate(oncemill_decisions_total{handler=~"$handlr"}[5m])`, `unknown Grafana variable $handlr`},
		{`sum(rate(oncemill_decisions_total[5m])`, `parse error`},
		{`label_values(oncemill_decisions_total, scope)`, `oncemill_decisions_total has no label scope`},
	} {
		errs := check(c.query, series)
		if len(errs) != 1 || !strings.Contains(errs[0].Error(), c.want) {
			t.Errorf("check(%s) = %v, want one error containing %q", c.query, errs, c.want)
		}
	}
	// A rules file Prometheus would refuse is reported.
	for _, c := range []struct{ rules, want string }{
		{"groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        for: 5minutes\n", `unknown unit "minutes"`},
		{"groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up\n        severity: page\n", `field severity not found`},
		{"groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: sum(up\n", `unclosed left parenthesis`},
	} {
		if _, errs := parseRules([]byte(c.rules)); len(errs) == 0 || !strings.Contains(fmt.Sprint(errs), c.want) {
			t.Errorf("parseRules(%q) = %v, want an error containing %q", c.rules, errs, c.want)
		}
	}
	// And accepts what is exported, Grafana's variables and Prometheus's
	// own labels included.
	for _, q := range []string{
		`sum by (job, handler) (rate(oncemill_decisions_total{handler=~"$handler",decision=~"replay|held"}[$__rate_interval]))`,
		`histogram_quantile(0.99, sum by (operation, le) (rate(oncemill_store_duration_seconds_bucket[5m])))`,
		`label_values(oncemill_decisions_total, handler)`,
	} {
		if errs := check(q, series); len(errs) > 0 {
			t.Errorf("check(%s) = %v, want no error", q, errs)
		}
	}
}

// dashboardExprs decodes the dashboard and returns its panels' queries and
// its template variables' label_values queries.
func dashboardExprs(t *testing.T) []expr {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []expr
	vars := map[string]bool{}
	for _, v := range d.Templating.List {
		vars[v.Name] = true
		if v.Type == "query" {
			out = append(out, expr{fmt.Sprintf("%s: variable %s", dashboardFile, v.Name), v.Definition})
		}
	}
	for _, want := range []string{"datasource", "handler"} {
		if !vars[want] {
			t.Errorf("%s: no %s variable", dashboardFile, want)
		}
	}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", dashboardFile, p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, expr{fmt.Sprintf("%s: panel %q, query %s", dashboardFile, p.Title, tg.RefID), tg.Expr})
		}
	}
	if len(d.Panels) == 0 {
		t.Fatalf("%s: no panels", dashboardFile)
	}
	return out
}

// ruleExprs parses the rules file and returns each rule's expression.
func ruleExprs(t *testing.T) []expr {
	t.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	out, errs := parseRules(b)
	for _, err := range errs {
		t.Errorf("%s: %v", rulesFile, err)
	}
	if len(errs) == 0 && len(out) == 0 {
		t.Errorf("%s: no rules", rulesFile)
	}
	return out
}

// parseRules parses rules as Prometheus loads a rules file (rulefmt,
// unknown fields refused, expressions and templates validated).
func parseRules(b []byte) ([]expr, []error) {
	groups, errs := rulefmt.Parse(b, false, model.UTF8Validation, promQLParser, slog.Default())
	if len(errs) > 0 {
		return nil, errs
	}
	var out []expr
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			out = append(out, expr{fmt.Sprintf("%s: group %s, alert %s", rulesFile, g.Name, r.Alert), r.Expr})
		}
	}
	return out, nil
}

// grafanaVars are the dashboard's variables and Grafana's own, replaced by
// values of the same kind before the query is parsed.
var grafanaVars = map[string]string{
	"handler":         ".*",
	"__rate_interval": "5m",
	"__interval":      "1m",
	"__range":         "1h",
}

var (
	grafanaVarRE  = regexp.MustCompile(`\$\{?(\w+)\}?`)
	labelValuesRE = regexp.MustCompile(`^label_values\(\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)$`)
	literalAltsRE = regexp.MustCompile(`^[a-zA-Z0-9_]+(\|[a-zA-Z0-9_]+)*$`)
	promQLParser  = parser.NewParser(parser.Options{})
)

// check parses query and returns an error for each series, label or label
// value it names that series does not have.
func check(query string, series exported) []error {
	var errs []error
	query = grafanaVarRE.ReplaceAllStringFunc(query, func(v string) string {
		name := grafanaVarRE.FindStringSubmatch(v)[1]
		if r, ok := grafanaVars[name]; ok {
			return r
		}
		errs = append(errs, fmt.Errorf("unknown Grafana variable %s", v))
		return v
	})
	if len(errs) > 0 {
		return errs
	}
	// Grafana's label_values(metric, label) is not PromQL.
	if m := labelValuesRE.FindStringSubmatch(query); m != nil {
		return checkLabels(m[1], []string{m[2]}, series)
	}
	root, err := promQLParser.ParseExpr(query)
	if err != nil {
		return []error{fmt.Errorf("parse error: %w", err)}
	}
	parser.Inspect(root, func(node parser.Node, _ []parser.Node) error {
		switch n := node.(type) {
		case *parser.VectorSelector:
			errs = append(errs, checkSelector(n, series)...)
		case *parser.AggregateExpr:
			errs = append(errs, checkGrouping(n.Expr, n.Grouping, series)...)
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil {
				grouping := append(slices.Clone(vm.MatchingLabels), vm.Include...)
				errs = append(errs, checkGrouping(n.LHS, grouping, series)...)
				errs = append(errs, checkGrouping(n.RHS, grouping, series)...)
			}
		}
		return nil
	})
	return errs
}

// checkSelector checks a selector's metric name, its matchers' labels and
// the literal values they match.
func checkSelector(s *parser.VectorSelector, series exported) []error {
	name := s.Name
	if name == "" {
		return []error{fmt.Errorf("selector %s does not name its metric", s)}
	}
	labelsOf, ok := series[name]
	if !ok {
		return []error{fmt.Errorf("metric %s is not exported (exported: %s)", name, strings.Join(keys(series), ", "))}
	}
	var errs []error
	for _, m := range s.LabelMatchers {
		if m.Name == labels.MetricName {
			continue
		}
		if err := checkLabels(name, []string{m.Name}, series); err != nil {
			errs = append(errs, err...)
			continue
		}
		if slices.Contains(scrapeLabels, m.Name) {
			continue
		}
		var values []string
		switch {
		case m.Type == labels.MatchEqual || m.Type == labels.MatchNotEqual:
			values = []string{m.Value}
		case (m.Type == labels.MatchRegexp || m.Type == labels.MatchNotRegexp) && literalAltsRE.MatchString(m.Value):
			values = strings.Split(m.Value, "|")
		}
		for _, v := range values {
			if !labelsOf[m.Name][v] {
				errs = append(errs, fmt.Errorf("%s{%s} never has the value %q (seen: %s)", name, m.Name, v, strings.Join(keys(labelsOf[m.Name]), ", ")))
			}
		}
	}
	return errs
}

// checkGrouping checks that every selector under e has each grouping label.
func checkGrouping(e parser.Expr, grouping []string, series exported) []error {
	var errs []error
	parser.Inspect(e, func(node parser.Node, _ []parser.Node) error {
		if s, ok := node.(*parser.VectorSelector); ok && series[s.Name] != nil {
			errs = append(errs, checkLabels(s.Name, grouping, series)...)
		}
		return nil
	})
	return errs
}

// checkLabels checks that metric is exported with each label, or that
// Prometheus adds it at the scrape.
func checkLabels(metric string, want []string, series exported) []error {
	labelsOf, ok := series[metric]
	if !ok {
		return []error{fmt.Errorf("metric %s is not exported (exported: %s)", metric, strings.Join(keys(series), ", "))}
	}
	var errs []error
	for _, l := range want {
		if _, ok := labelsOf[l]; !ok && !slices.Contains(scrapeLabels, l) {
			errs = append(errs, fmt.Errorf("%s has no label %s (its labels: %s)", metric, l, strings.Join(keys(labelsOf), ", ")))
		}
	}
	return errs
}

func keys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
