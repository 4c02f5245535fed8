package alerts_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail/extra/prom/alerts"
	"github.com/guardrail-go/guardrail/extra/prom/grafana"
	"github.com/guardrail-go/guardrail/extra/prom/internal/series"
)

// promtool checks the rules and runs their unit tests
// (guardrail.rules_test.yml). It comes with Prometheus (Debian's
// prometheus package); without it the test skips, unless
// GUARDRAIL_TEST_PROMTOOL_REQUIRED is set, as CI sets it.
func TestPromtool(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("GUARDRAIL_TEST_PROMTOOL_REQUIRED") != "" {
			t.Fatal("promtool is not on PATH and GUARDRAIL_TEST_PROMTOOL_REQUIRED is set")
		}
		t.Skip("promtool is not on PATH (install Prometheus, e.g. Debian's prometheus package); skipping the rules' checks")
	}
	for _, args := range [][]string{
		{"check", "rules", "guardrail.rules.yml"},
		{"test", "rules", "guardrail.rules_test.yml"},
	} {
		out, err := exec.Command(promtool, args...).CombinedOutput()
		if err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// alert is what the checks below read of one alerting rule.
type alert struct {
	name, expr, panel, runbook string
}

// parse reads the alerts and recording rules of the rules file: the file
// is ours and keeps one layout, so a line reader is enough.
func parse(t *testing.T) (list []alert, recorded map[string]string) {
	t.Helper()
	recorded = make(map[string]string)
	var cur *alert
	var record string
	inExpr := false
	sc := bufio.NewScanner(bytes.NewReader(alerts.Rules()))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "- alert: "):
			list = append(list, alert{name: strings.TrimPrefix(line, "- alert: ")})
			cur, record, inExpr = &list[len(list)-1], "", false
		case strings.HasPrefix(line, "- record: "):
			cur, record, inExpr = nil, strings.TrimPrefix(line, "- record: "), false
		case strings.HasPrefix(line, "expr: "):
			inExpr = true
			line = strings.TrimPrefix(line, "expr: ")
			fallthrough
		case inExpr && !strings.Contains(line, ": ") && line != "":
			if cur != nil {
				cur.expr += " " + line
			} else if record != "" {
				recorded[record] += " " + line
			}
		default:
			inExpr = false
			if v, ok := strings.CutPrefix(line, "dashboard_panel: "); ok && cur != nil {
				cur.panel = strings.Trim(v, `"`)
			}
			if v, ok := strings.CutPrefix(line, "runbook: "); ok && cur != nil {
				cur.runbook = strings.Trim(v, `"`)
			}
		}
	}
	if len(list) == 0 || len(recorded) == 0 {
		t.Fatalf("read %d alerts and %d recording rules; the file's layout changed", len(list), len(recorded))
	}
	return list, recorded
}

var metricRE = regexp.MustCompile(`guardrail_[a-z_]+`)

// metrics returns the guardrail_* series expr reads, through the
// recording rules it uses.
func metrics(expr string, recorded map[string]string) []string {
	for name, body := range recorded {
		if strings.Contains(expr, name) {
			expr += " " + body
		}
	}
	found := metricRE.FindAllString(expr, -1)
	for i, m := range found {
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			m = strings.TrimSuffix(m, suffix)
		}
		found[i] = m
	}
	slices.Sort(found)
	return slices.Compact(found)
}

// Every alert links to a dashboard panel that plots a series the alert
// fires on, and to a section of docs/metrics.md, and reads only
// documented series.
func TestAlertsLinkToTheirPanelAndRunbook(t *testing.T) {
	var dash struct {
		UID    string `json:"uid"`
		Panels []struct {
			ID      int `json:"id"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(grafana.Dashboard(), &dash); err != nil {
		t.Fatal(err)
	}
	panels := make(map[string]string)
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			panels[strconv.Itoa(p.ID)] += " " + tg.Expr
		}
	}
	doc, err := os.ReadFile("../../../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	anchors := make(map[string]bool)
	for _, line := range strings.Split(string(doc), "\n") {
		if h, ok := strings.CutPrefix(line, "### "); ok {
			anchors[strings.ToLower(strings.ReplaceAll(strings.TrimSpace(h), " ", "-"))] = true
		}
	}
	documented := make(map[string]bool)
	for _, d := range series.All {
		documented[d.Name] = true
	}

	list, recorded := parse(t)
	for _, a := range list {
		used := metrics(a.expr, recorded)
		if len(used) == 0 {
			t.Errorf("%s: reads no guardrail_* series: %q", a.name, a.expr)
		}
		for _, m := range used {
			if !documented[m] {
				t.Errorf("%s reads %s, which is not a guardrail series", a.name, m)
			}
		}
		shown, ok := panels[a.panel]
		if !ok {
			t.Errorf("%s: dashboard_panel %q is not a panel of the dashboard", a.name, a.panel)
		} else if !slices.ContainsFunc(used, func(m string) bool { return strings.Contains(shown, m) }) {
			t.Errorf("%s: panel %s plots none of %v", a.name, a.panel, used)
		}
		if want := "docs/metrics.md#" + strings.ToLower(a.name); a.runbook != want {
			t.Errorf("%s: runbook %q, want %q", a.name, a.runbook, want)
		} else if !anchors[strings.ToLower(a.name)] {
			t.Errorf("%s: docs/metrics.md has no section \"### %s\"", a.name, a.name)
		}
	}
	for name, body := range recorded {
		for _, m := range metrics(body, nil) {
			if !documented[m] {
				t.Errorf("recording rule %s reads %s, which is not a guardrail series", name, m)
			}
		}
	}
}
