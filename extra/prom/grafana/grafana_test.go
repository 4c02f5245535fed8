package grafana_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/extra/prom"
	"github.com/guardrail-go/guardrail/extra/prom/grafana"
	"github.com/guardrail-go/guardrail/shed"
)

// family is what the Prometheus collector registers under one name.
type family struct {
	kind   string // counter, gauge, histogram
	labels []string
}

// registered returns the families the collector describes, with the type
// each has once every kind of event was observed.
func registered(t *testing.T) map[string]family {
	t.Helper()
	c := newCollector(t, prom.Config{})
	fams := make(map[string]family)
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	descRE := regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		var labels []string
		if m[2] != "" {
			labels = strings.Split(m[2], ",")
		}
		fams[m[1]] = family{labels: labels}
	}

	// Give every family a child so Gather reports its type.
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	c.WatchBreaker("d", must(breaker.New(breaker.Config{})))
	c.WatchBudget("d", must(budget.New(budget.Config{})))
	c.WatchShedder("d", must(shed.New(shed.Config{Limit: 2})))
	ctx := context.Background()
	for k := event.CallStart; k <= event.Metastable; k++ {
		for _, outcome := range []string{event.OutcomeOK, event.OutcomeError} {
			c.Observe(ctx, event.Event{Kind: k, Dependency: "d", Operation: "o", Attempt: 2, Outcome: outcome,
				Reason: "r", Phase: "p", Priority: "q", From: "closed", To: "open", Remaining: time.Second})
		}
	}
	got, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range got {
		f, ok := fams[mf.GetName()]
		if !ok {
			t.Fatalf("gathered %s, which was not described", mf.GetName())
		}
		switch mf.GetType() {
		case dto.MetricType_COUNTER:
			f.kind = "counter"
		case dto.MetricType_GAUGE:
			f.kind = "gauge"
		case dto.MetricType_HISTOGRAM:
			f.kind = "histogram"
		}
		fams[mf.GetName()] = f
	}
	for name, f := range fams {
		if f.kind == "" {
			t.Fatalf("%s has no sample after every kind of event", name)
		}
	}
	return fams
}

var (
	seriesRE  = regexp.MustCompile(`\bguardrail_[a-z0-9_]+`)
	matcherRE = regexp.MustCompile(`(guardrail_[a-z0-9_]+)\{([^}]*)\}`)
	labelRE   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)`)
	groupRE   = regexp.MustCompile(`\b(?:by|without|on|ignoring)\s*\(([^)]*)\)`)
)

// resolve maps a name used in a query to its family: histograms are
// queried through _bucket, _sum and _count.
func resolve(fams map[string]family, name string) (string, family, bool) {
	if f, ok := fams[name]; ok && f.kind != "histogram" {
		return name, f, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if f, found := fams[base]; ok && found && f.kind == "histogram" {
			if suffix == "_bucket" {
				f.labels = append(slices.Clone(f.labels), "le")
			}
			return base, f, true
		}
	}
	return "", family{}, false
}

// reporter is the part of *testing.T that checkQuery uses.
type reporter interface {
	Helper()
	Errorf(format string, args ...any)
}

// checkQuery reports what is wrong with a PromQL query against the
// registered families, and returns the families it uses.
func checkQuery(t reporter, where, q string, fams map[string]family) []string {
	t.Helper()
	if strings.TrimSpace(q) == "" {
		t.Errorf("%s: empty query", where)
		return nil
	}
	depth := map[rune]int{}
	for _, r := range q {
		switch r {
		case '(', '[', '{':
			depth[r]++
		case ')':
			depth['(']--
		case ']':
			depth['[']--
		case '}':
			depth['{']--
		}
		for open, d := range depth {
			if d < 0 {
				t.Errorf("%s: unbalanced %q in %s", where, open, q)
				return nil
			}
		}
	}
	for open, d := range depth {
		if d != 0 {
			t.Errorf("%s: unbalanced %q in %s", where, open, q)
		}
	}
	var used []string
	labels := map[string]bool{}
	for _, name := range seriesRE.FindAllString(q, -1) {
		base, f, ok := resolve(fams, name)
		if !ok {
			t.Errorf("%s: %s is not a series the collector registers", where, name)
			continue
		}
		used = append(used, base)
		for _, l := range f.labels {
			labels[l] = true
		}
	}
	if len(used) == 0 {
		t.Errorf("%s: names no guardrail series: %s", where, q)
	}
	for _, m := range matcherRE.FindAllStringSubmatch(q, -1) {
		_, f, ok := resolve(fams, m[1])
		if !ok {
			continue
		}
		for _, lm := range labelRE.FindAllStringSubmatch(m[2], -1) {
			if !slices.Contains(f.labels, lm[1]) && lm[1] != "__name__" {
				t.Errorf("%s: %s has no label %q", where, m[1], lm[1])
			}
		}
	}
	for _, g := range groupRE.FindAllStringSubmatch(q, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !labels[l] {
				t.Errorf("%s: groups by %q, a label of none of its series", where, l)
			}
		}
	}
	return used
}

type panel struct {
	ID      int    `json:"id"`
	Type    string `json:"type"`
	Title   string `json:"title"`
	GridPos struct {
		H, W, X, Y int
	} `json:"gridPos"`
	Targets []struct {
		Expr  string `json:"expr"`
		RefID string `json:"refId"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

type dashboard struct {
	Title      string  `json:"title"`
	UID        string  `json:"uid"`
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string          `json:"name"`
			Type       string          `json:"type"`
			Definition string          `json:"definition"`
			Query      json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

// TestDashboardQueriesNameRegisteredSeries: the dashboard parses, every
// query names only series (and labels) the collector registers, and every
// series is on the dashboard.
func TestDashboardQueriesNameRegisteredSeries(t *testing.T) {
	fams := registered(t)
	var d dashboard
	dec := json.NewDecoder(strings.NewReader(string(grafana.Dashboard())))
	if err := dec.Decode(&d); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	if d.Title == "" || d.UID == "" {
		t.Errorf("dashboard lacks a title or uid")
	}
	used := map[string]bool{}
	ids := map[int]bool{}
	queries := 0
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if ids[p.ID] {
				t.Errorf("panel id %d used twice", p.ID)
			}
			ids[p.ID] = true
			if p.GridPos.X < 0 || p.GridPos.W <= 0 || p.GridPos.X+p.GridPos.W > 24 {
				t.Errorf("panel %q: gridPos %+v outside the 24 columns", p.Title, p.GridPos)
			}
			if p.Type != "row" && len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			refs := map[string]bool{}
			for _, tg := range p.Targets {
				if refs[tg.RefID] {
					t.Errorf("panel %q: refId %q twice", p.Title, tg.RefID)
				}
				refs[tg.RefID] = true
				queries++
				for _, s := range checkQuery(t, "panel "+p.Title, dashboardQuery(tg.Expr), fams) {
					used[s] = true
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		for _, s := range checkQuery(t, "variable "+v.Name, labelValuesQuery(v.Definition), fams) {
			used[s] = true
		}
	}
	if queries < 20 {
		t.Errorf("only %d queries: the dashboard lost panels", queries)
	}
	var unused []string
	for name := range fams {
		if !used[name] {
			unused = append(unused, name)
		}
	}
	sort.Strings(unused)
	if len(unused) > 0 {
		t.Errorf("series not on the dashboard: %v", unused)
	}
}

// dashboardQuery replaces Grafana's variables with what they stand for.
func dashboardQuery(q string) string {
	return strings.NewReplacer("$__rate_interval", "5m", "$__range", "1h", "$dependency", ".*").Replace(q)
}

// labelValuesQuery turns label_values(series, label) into the series, and
// checks nothing else.
func labelValuesQuery(def string) string {
	inner, ok := strings.CutPrefix(def, "label_values(")
	if !ok {
		return def
	}
	series, label, _ := strings.Cut(strings.TrimSuffix(inner, ")"), ",")
	return "sum by (" + strings.TrimSpace(label) + ") (" + series + ")"
}

// TestDocsListEverySeries: docs/metrics.md has one row per registered
// series, with its type and labels, and its PromQL names only those series.
func TestDocsListEverySeries(t *testing.T) {
	fams := registered(t)
	doc, err := os.ReadFile("../../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	rowRE := regexp.MustCompile("(?m)^\\| `(guardrail_[a-z0-9_]+)` \\| ([a-z]+) \\| ([a-z, ]+) \\| (.+) \\|$")
	documented := map[string]bool{}
	for _, m := range rowRE.FindAllStringSubmatch(string(doc), -1) {
		name, kind, labels := m[1], m[2], strings.Split(m[3], ", ")
		f, ok := fams[name]
		switch {
		case !ok:
			t.Errorf("docs list %s, which the collector does not register", name)
			continue
		case documented[name]:
			t.Errorf("docs list %s twice", name)
		case kind != f.kind:
			t.Errorf("docs say %s is a %s; it is a %s", name, kind, f.kind)
		case !slices.Equal(labels, f.labels):
			t.Errorf("docs give %s the labels %v; it has %v", name, labels, f.labels)
		}
		documented[name] = true
	}
	for name := range fams {
		if !documented[name] {
			t.Errorf("%s is not in docs/metrics.md's table", name)
		}
	}

	blockRE := regexp.MustCompile("(?s)```promql\n(.*?)```")
	blocks := blockRE.FindAllStringSubmatch(string(doc), -1)
	if len(blocks) < 8 {
		t.Errorf("only %d PromQL blocks in docs/metrics.md", len(blocks))
	}
	for _, b := range blocks {
		checkQuery(t, "docs/metrics.md", b[1], fams)
	}
	for _, want := range []string{"Retry ratio", "Attempts per request", "Breaker time open", "Goodput"} {
		if !strings.Contains(string(doc), want) {
			t.Errorf("docs/metrics.md lacks the %q query", want)
		}
	}
}

// TestCheckQueryCatchesMistakes: the checker is not a rubber stamp.
func TestCheckQueryCatchesMistakes(t *testing.T) {
	fams := registered(t)
	for _, q := range []string{
		`rate(guardrail_call_total[5m])`,                       // misspelt
		`rate(guardrail_calls_total{phase="x"}[5m])`,           // a label it lacks
		`sum by (le) (rate(guardrail_calls_total_bucket[5m]))`, // not a histogram
		`sum by (priority) (rate(guardrail_calls_total[5m]))`,  // grouping by a label of none of its series
		`rate(guardrail_attempt_duration_seconds[5m])`,         // a histogram by its base name
		`sum(rate(guardrail_calls_total[5m])`,                  // unbalanced
		`up`,                                                   // no guardrail series
	} {
		var r fakeT
		checkQuery(&r, "q", q, fams)
		if len(r.errs) == 0 {
			t.Errorf("checker accepted %s", q)
		}
	}
}

// fakeT collects what checkQuery reports.
type fakeT struct{ errs []string }

func (f *fakeT) Helper() {}
func (f *fakeT) Errorf(format string, args ...any) {
	f.errs = append(f.errs, fmt.Sprintf(format, args...))
}

// newCollector returns prom.New(cfg), failing the test on an error.
func newCollector(t testing.TB, cfg prom.Config) *prom.Collector {
	t.Helper()
	c, err := prom.New(cfg)
	if err != nil {
		t.Fatalf("prom.New: %v", err)
	}
	return c
}

// must returns v, for constructors given a configuration the test knows is
// valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
