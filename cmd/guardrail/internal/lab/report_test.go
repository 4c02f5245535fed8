package lab

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/cmd/guardrail/internal/sim"
)

// trialCharts returns the charts whose drawing went wrong before, with the
// numbers of a full run: a breaker row of 0.020 DB calls per user, a
// half-open state of 1 ms between 1,001 ms open and 1,200 ms closed, and
// the jitter simulation itself (no jitter runs until 32.7 s).
func trialCharts(t *testing.T) []*Result {
	t.Helper()
	amp := &Result{Experiment: "amplification", Title: "amplification"}
	amp.Charts = append(amp.Charts, ampChart(
		[]string{"every tier 1+3 retries (1 user)", "retry only at the tier nearest the DB (1 user)",
			"nearest tier + retry budget 10%, one user at a time (1000 users)", "nearest tier + retry budget 10%, users spread over 2s (1000 users)",
			"nearest tier, no budget, users spread over 2s (1000 users)", "nearest tier + budget 10% + default breaker, users spread over 2s (1000 users)"},
		[]float64{64, 4, 1.11, 1.11, 4, 0.020}))
	br := &Result{Experiment: "breaker", Title: "breaker"}
	br.Charts = append(br.Charts, breakerChart(
		[]time.Duration{0, 0, 1001 * time.Millisecond, 1002 * time.Millisecond, 2202 * time.Millisecond},
		[]breaker.State{breaker.Closed, breaker.Open, breaker.HalfOpen, breaker.Closed, breaker.Closed}))
	jit := runExp(t, "jitter")
	// Empty buckets, as in the shedding histograms: a bar of 0 has no height.
	hist := &Result{Experiment: "histogram", Title: "histogram", Charts: []Chart{{Title: "latency", Kind: "bar",
		X: []string{"0-50", "50-100", "100-150"}, Series: []Series{{Name: "ok", Values: []float64{12, 0, 3}}, {Name: "late", Values: []float64{0, 0, 7}}}}}}
	// The same series in another order in the next chart: it keeps its
	// colour. And a table as wide as the shedding one, with a failed and
	// a not-judged check.
	hist.Charts = append(hist.Charts, Chart{Title: "latency again", Kind: "bar", X: []string{"0-50", "50-100"},
		Series: []Series{{Name: "late", Values: []float64{1, 2}}, {Name: "ok", Values: []float64{3, 4}}}})
	var cols []Col
	for i := range 24 {
		cols = append(cols, Col{Key: fmt.Sprintf("a_rather_long_column_%d", i), Value: "1234.5ms"})
	}
	hist.Rows = []Row{{Label: "a row whose label is long as well", Cols: cols}}
	hist.Checks = []Check{{Name: "goodput held", Verdict: Fail, Detail: "40%"}, {Name: "p99 lower", Verdict: NotJudged, Detail: "busy"}}
	// A run that never recovered, beside the 1,500 ms its run lasted
	// (once drawn as a bar of that length); a row not judged; a timeline
	// of a run not judged; numbers held against a target.
	rec := &Result{Experiment: "incident", Title: "recovery", Charts: []Chart{{Title: "recovery against outage", Kind: "bar",
		X: []string{"0.5s", "1s", "2s"}, Series: []Series{
			{Name: "naive", Values: []float64{300, 900, 1500}, Never: []bool{false, false, true}},
			{Name: "guarded", Values: []float64{40, 60, 80}, NotJudged: []bool{false, true, false}}}}}}
	rec.Charts = append(rec.Charts, Chart{Title: "goodput over time", Kind: "line", XLabel: "time (s)", XValues: []float64{0, 1, 2, 3},
		Series: []Series{{Name: "DB down", Values: []float64{0, 100, 0, 0}, Fill: true}, {Name: "naive", Values: []float64{100, 20, 10, 90}},
			Series{Name: "guarded", Values: []float64{100, 80, 95, 100}}.notJudgedIf(false)}})
	rec.Rows = []Row{row("guarded", Float("slower_pct", 17.7, 1).As("vs plain", "%+.1f%%").judgedAs(Fail),
		Float("other_pct", 4, 1).As("vs other", "%+.1f%%").judgedAs(Pass), Ms("recovery_ms", 1259*time.Millisecond))}
	rec.Checks = []Check{{Name: "within 1.10x", Verdict: Fail, Detail: "+17.7%"}}
	return []*Result{amp, br, jit, hist, rec}
}

// TestJitterChartCoversEveryRow: the axis reaches the end of the longest
// row, no jitter's 32.7 s, not only the jittered rows' 3.5 s.
func TestJitterChartCoversEveryRow(t *testing.T) {
	rows, err := sim.Jitter(context.Background(), sim.JitterConfig{Config: sim.Config{Seed: 1}, Base: 100 * time.Millisecond,
		Cap: 10 * time.Second, PlusJitter: 100 * time.Millisecond, Strategies: sim.Strategies()})
	if err != nil {
		t.Fatal(err)
	}
	charts := jitterCharts(rows, "", sim.DefaultSlot)
	full := charts[0]
	last := full.XValues[len(full.XValues)-1]
	for _, row := range rows {
		if done := row.Result.AllDoneAt.Seconds(); last < done {
			t.Errorf("the axis ends at %gs, before %s is done at %gs", last, row.Label, done)
		}
		for _, s := range full.Series {
			if len(s.Values) != len(full.XValues) {
				t.Fatalf("series %s has %d values for %d x values", s.Name, len(s.Values), len(full.XValues))
			}
		}
	}
	if len(charts) != 2 || !strings.Contains(charts[1].Title, "first") {
		t.Errorf("want a second chart zoomed on the jittered rows, got %d charts", len(charts))
	}
}

// chromium returns the path of a headless-capable Chromium, or skips.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("no Chromium on PATH (chromium, chromium-browser or google-chrome): the report's charts are not rendered; install chromium to run this test")
	return ""
}

// probe runs after the report's own script, once Chart.js has drawn every
// chart (animation is off, so drawing is synchronous), and writes what it
// finds into the page, which --dump-dom prints: for each chart and
// dataset, the points that should be drawn and the ones drawn inside the
// plot area (a bar of a value other than 0 also needs a height of at
// least 2 px), the x axis's
// range against the data's, the points' pixel positions against their
// values on a linear axis, and the coloured pixels of the plot area.
const probe = `<script>
(() => {
  const out = [];
  for (const ch of Object.values(Chart.instances)) {
    const a = ch.chartArea, xs = ch.scales.x, ys = ch.scales.y;
    const r = {id: ch.canvas.id, type: ch.config.type, xType: xs.type, xMin: xs.min, xMax: xs.max, dataXMin: Infinity, dataXMax: -Infinity, datasets: [], misplaced: 0};
    ch.data.datasets.forEach((ds, k) => {
      const meta = ch.getDatasetMeta(k);
      const d = {label: ds.label, colour: ds.borderColor, want: 0, drawn: 0, missing: [], never: [], faded: [], dashed: !!ds.borderDash};
      // Each point marked never: its marker's pixel, and that no bar or
      // point of a value stands there.
      for (const m of (ch.$never || []).filter(m => m.dataset === k)) {
        const dpr = ch.currentDevicePixelRatio || 1;
        const px = ch.ctx.getImageData(m.x * dpr, m.y * dpr, 1, 1).data;
        const el = meta.data[m.index];
        const raw = ds.data[m.index];
        const v = raw !== null && typeof raw === 'object' ? raw.y : raw;
        d.never.push({index: m.index, inked: px[3] > 0 && Math.max(px[0], px[1], px[2]) - Math.min(px[0], px[1], px[2]) > 40,
          atTop: Math.abs(m.y - a.top) < 20, value: v ?? null, barHeight: el && Number.isFinite(el.base - el.y) ? Math.abs(el.base - el.y) : 0});
      }
      if (Array.isArray(ds.backgroundColor)) ds.backgroundColor.forEach((bg, i) => { if (bg.length === 9 && bg.endsWith('40')) d.faded.push(i); });
      const pts = [];
      meta.data.forEach((el, i) => {
        const raw = ds.data[i];
        const v = raw !== null && typeof raw === 'object' ? raw.y : raw;
        if (raw !== null && typeof raw === 'object') { r.dataXMin = Math.min(r.dataXMin, raw.x); r.dataXMax = Math.max(r.dataXMax, raw.x); }
        if (v == null || (ys.type === 'logarithmic' && v <= 0)) return;
        d.want++;
        const p = el.getProps(['x', 'y', 'base'], true);
        const inside = p.x >= a.left - 1 && p.x <= a.right + 1 && p.y >= a.top - 1 && p.y <= a.bottom + 1;
        const tall = ch.config.type !== 'bar' || v === 0 || Math.abs(p.base - p.y) >= 2;
        if (inside && tall && !el.skip) d.drawn++; else d.missing.push(i);
        if (raw !== null && typeof raw === 'object') pts.push([raw.x, p.x]);
      });
      if (xs.type === 'linear' && pts.length > 1) {
        const [x0, p0] = pts[0], [x1, p1] = pts[pts.length - 1];
        for (const [x, p] of pts) {
          if (x1 !== x0 && Math.abs((p - p0) - (x - x0) / (x1 - x0) * (p1 - p0)) > 1.5) r.misplaced++;
        }
      }
      r.datasets.push(d);
    });
    const dpr = ch.currentDevicePixelRatio || 1;
    const img = ch.ctx.getImageData(a.left * dpr, a.top * dpr, (a.right - a.left) * dpr, (a.bottom - a.top) * dpr).data;
    let ink = 0;
    for (let i = 0; i < img.length; i += 4) {
      const m = Math.max(img[i], img[i+1], img[i+2]), n = Math.min(img[i], img[i+1], img[i+2]);
      if (img[i+3] > 0 && m - n > 40) ink++;
    }
    r.ink = ink;
    out.push(r);
  }
  const pre = document.createElement('pre');
  pre.id = 'chart-probe';
  const summary = document.getElementById('summary');
  pre.textContent = JSON.stringify({charts: out, pageWidth: document.documentElement.scrollWidth,
    viewWidth: window.innerWidth, summary: summary ? summary.innerText : '',
    headers: [...document.querySelectorAll('th')].map(e => e.innerText).join('|'),
    cells: [...document.querySelectorAll('td')].map(e => e.innerText).join('|'),
    links: summary ? [...summary.querySelectorAll('a')].filter(a => document.getElementById(a.hash.slice(1))).length : 0});
  document.body.appendChild(pre);
})();
</script>`

type probedChart struct {
	ID        string  `json:"id"`
	Type      string  `json:"type"`
	XType     string  `json:"xType"`
	XMin      float64 `json:"xMin"`
	XMax      float64 `json:"xMax"`
	DataXMin  any     `json:"dataXMin"` // Infinity is not JSON: null then
	DataXMax  any     `json:"dataXMax"`
	Misplaced int     `json:"misplaced"`
	Ink       int     `json:"ink"`
	Datasets  []struct {
		Label   string `json:"label"`
		Colour  string `json:"colour"`
		Want    int    `json:"want"`
		Drawn   int    `json:"drawn"`
		Missing []int  `json:"missing"`
		Never   []struct {
			Index     int      `json:"index"`
			Inked     bool     `json:"inked"`
			AtTop     bool     `json:"atTop"`
			Value     *float64 `json:"value"`
			BarHeight float64  `json:"barHeight"`
		} `json:"never"`
		Faded  []int `json:"faded"`
		Dashed bool  `json:"dashed"`
	} `json:"datasets"`
}

// TestReportChartsDraw renders the report in headless Chromium and checks
// that every chart drew every point it was given, inside its axes, to
// scale on a time axis.
func TestReportChartsDraw(t *testing.T) {
	bin := chromium(t)
	results := trialCharts(t)
	var buf bytes.Buffer
	if err := WriteReport(&buf, results, time.Second); err != nil {
		t.Fatal(err)
	}
	page := strings.Replace(buf.String(), "</body>", probe+"\n</body>", 1)
	dir := t.TempDir()
	file := filepath.Join(dir, "report.html")
	if err := os.WriteFile(file, []byte(page), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir="+filepath.Join(dir, "profile"), "--window-size=1400,4000", "--virtual-time-budget=10000",
		"--dump-dom", "file://"+file)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	dom, err := cmd.Output()
	if err != nil {
		t.Fatalf("chromium: %v\n%s", err, stderr.String())
	}
	m := regexp.MustCompile(`(?s)<pre id="chart-probe">(.*?)</pre>`).FindSubmatch(dom)
	if m == nil {
		t.Fatalf("the page wrote no probe: the report's script failed?\n%s", stderr.String())
	}
	var probed struct {
		Charts    []probedChart `json:"charts"`
		PageWidth int           `json:"pageWidth"`
		ViewWidth int           `json:"viewWidth"`
		Summary   string        `json:"summary"`
		Links     int           `json:"links"`
		Headers   string        `json:"headers"`
		Cells     string        `json:"cells"`
	}
	if err := json.Unmarshal([]byte(html.UnescapeString(string(m[1]))), &probed); err != nil {
		t.Fatalf("probe: %v: %s", err, m[1])
	}
	got := probed.Charts
	// The page never scrolls sideways: a wide table scrolls in its box.
	if probed.PageWidth > probed.ViewWidth {
		t.Errorf("the page is %d px wide in a %d px window: a table is cut off", probed.PageWidth, probed.ViewWidth)
	}
	pass, fail, unjudged := 0, 0, 0
	for _, r := range results {
		for _, c := range r.Checks {
			switch c.Verdict {
			case Pass:
				pass++
			case Fail:
				fail++
			default:
				unjudged++
			}
		}
	}
	if want := fmt.Sprintf("%d passed, %d failed, %d not judged", pass, fail, unjudged); !strings.Contains(probed.Summary, want) {
		t.Errorf("summary %q, want it to say %q", probed.Summary, want)
	}
	if probed.Links != fail+unjudged {
		t.Errorf("the summary links to %d sections, want one per check that did not pass (%d)", probed.Links, fail+unjudged)
	}
	// Series of different names have different colours: the report has
	// fewer names than the palette has colours, and a shaded band takes
	// none of them.
	owner := map[string]string{}
	for _, c := range got {
		for _, d := range c.Datasets {
			hue := d.Colour[:min(7, len(d.Colour))]
			name := strings.TrimSuffix(d.Label, " (not judged)")
			if prev, ok := owner[hue]; ok && prev != name && !strings.HasPrefix(hue, "rgba") {
				t.Errorf("%s: series %q has %s, the colour of %q", c.ID, name, hue, prev)
			}
			owner[hue] = name
		}
	}
	colour := map[string]string{}
	for _, c := range got {
		for _, d := range c.Datasets {
			if prev, ok := colour[d.Label]; ok && prev != d.Colour {
				t.Errorf("%s: series %q is %s here and %s in an earlier chart", c.ID, d.Label, d.Colour, prev)
			}
			colour[d.Label] = d.Colour
		}
	}
	want := 0
	for _, r := range results {
		want += len(r.Charts)
	}
	if len(got) != want {
		t.Fatalf("%d charts drawn, want %d", len(got), want)
	}
	byID := map[string]probedChart{}
	for _, c := range got {
		byID[c.ID] = c
		for _, d := range c.Datasets {
			if d.Drawn != d.Want {
				t.Errorf("%s, %s: %d of %d points drawn; not drawn: %v", c.ID, d.Label, d.Drawn, d.Want, d.Missing)
			}
		}
		if c.Ink < 200 {
			t.Errorf("%s: %d coloured pixels in the plot area: blank", c.ID, c.Ink)
		}
		if c.Misplaced > 0 {
			t.Errorf("%s: %d points not at their value on the linear x axis", c.ID, c.Misplaced)
		}
		if c.XType == "linear" {
			lo, _ := c.DataXMin.(float64)
			hi, _ := c.DataXMax.(float64)
			if c.XMin > lo || c.XMax < hi {
				t.Errorf("%s: x axis %g..%g does not cover the data's %g..%g", c.ID, c.XMin, c.XMax, lo, hi)
			}
		}
	}
	// The run that never recovered is a marker at the top saying so,
	// not a bar of the 1,500 ms it lasted; the others are bars.
	recovery := byID[chartID(4, 0)]
	if len(recovery.Datasets) != 2 {
		t.Fatalf("recovery chart: %d datasets, want 2", len(recovery.Datasets))
	}
	naive, guarded := recovery.Datasets[0], recovery.Datasets[1]
	if len(naive.Never) != 1 || naive.Never[0].Index != 2 {
		t.Errorf("naive: never marks %+v, want one, at point 2", naive.Never)
	} else if m := naive.Never[0]; !m.Inked || !m.AtTop || m.Value != nil || m.BarHeight >= 2 {
		t.Errorf("naive, never: marker inked %v, at the top %v; value %v, bar %g px: want a marker at the top and no bar", m.Inked, m.AtTop, m.Value, m.BarHeight)
	}
	if naive.Want != 2 || naive.Drawn != 2 {
		t.Errorf("naive: %d of %d bars drawn, want the 2 that recovered", naive.Drawn, naive.Want)
	}
	if len(guarded.Never) != 0 || !slices.Equal(guarded.Faded, []int{1}) || guarded.Label != "guarded" {
		t.Errorf("guarded: never %v, faded %v, label %q; want no never mark, point 1 faded, the plain label", guarded.Never, guarded.Faded, guarded.Label)
	}
	// A series every point of which was not judged says so in the legend
	// and is dashed.
	if tl := byID[chartID(4, 1)]; len(tl.Datasets) != 3 || tl.Datasets[2].Label != "guarded (not judged)" || !tl.Datasets[2].Dashed || tl.Datasets[1].Dashed {
		t.Errorf("timeline: datasets %+v, want guarded labelled not judged and dashed, naive not", tl.Datasets)
	}
	if !strings.Contains(probed.Cells, "+17.7% ✗") || !strings.Contains(probed.Cells, "+4.0% ✓") || !strings.Contains(probed.Headers, "recovery") || strings.Contains(probed.Headers, "recovery_ms") {
		t.Errorf("table: headers %q, cells %q; want the verdicts beside the numbers and recovery without _ms", probed.Headers, probed.Cells)
	}
	if c := byID[chartID(1, 0)]; c.XType != "linear" {
		t.Errorf("breaker state: x axis is %q, want linear (a time axis)", c.XType)
	}
	if c := byID[chartID(2, 0)]; c.XType != "linear" || c.XMax < 32.7 {
		t.Errorf("jitter: x axis %q up to %g, want linear up to no jitter's 32.7 s", c.XType, c.XMax)
	}
}

// TestReportSeriesJSON: a point of no number (NaN, an infinity) or marked
// never is a gap in the chart's data, not a failed report or a stand-in
// value; a series all of whose points are not judged says so.
func TestReportSeriesJSON(t *testing.T) {
	r := &Result{Experiment: "x", Title: "x", Charts: []Chart{{Title: "c", Kind: "bar", X: []string{"a", "b", "c", "d"},
		Series: []Series{
			{Name: "s", Values: []float64{1, math.NaN(), math.Inf(1), 1500}, Never: []bool{false, false, false, true}},
			Series{Name: "u", Values: []float64{1, 2, 3, 4}}.notJudgedIf(false),
			Series{Name: "v", Values: []float64{1, 2, 3, 4}}.notJudgedIf(true),
		}}}}
	var buf bytes.Buffer
	if err := WriteReport(&buf, []*Result{r}, time.Second); err != nil {
		t.Fatalf("WriteReport: %v", err)
	}
	for _, want := range []string{
		`"values":[1,null,null,null],"never":[false,false,false,true]`,
		`"name":"u","values":[1,2,3,4],"nj":[true,true,true,true],"njAll":true`,
		`"name":"v","values":[1,2,3,4]}`,
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %s", want)
		}
	}
}

// TestReportHeaders: a column is headed as the text table names it, a
// duration's without _ms, or by its key where rows name it differently.
func TestReportHeaders(t *testing.T) {
	r := &Result{Experiment: "x", Title: "x", Rows: []Row{
		row("a", Float("slower_pct", 1, 1).As("vs plain", "%+.1f%%"), Ms("took_ms", time.Second).Named("took"), Ms("wait_ms", time.Second)),
		row("b", Float("slower_pct", 2, 1).As("vs plain+headers", "%+.1f%%"), Col{Key: "took_ms", Name: "took", Value: nil}, Ms("wait_ms", 531759339)),
	}}
	var buf bytes.Buffer
	if err := WriteReport(&buf, []*Result{r}, time.Second); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<th>slower_pct</th><th>took</th><th>wait</th>", "<td>1s</td><td>1s</td>", "<td>none</td><td>532ms</td>"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("report lacks %s", want)
		}
	}
}

// TestReportTableGroups: rows that measure different things get a table
// each; rows that share their columns stay in one.
func TestReportTableGroups(t *testing.T) {
	r := &Result{Experiment: "x", Title: "x", Rows: []Row{
		row("limiter", Int("processes", 8), Float("admitted_rps", 1000, 0), Float("p99_added_us", 5, 0)),
		row("semaphore", Int("processes", 8), Int("calls", 700), Int("max_in_flight", 16)),
		row("hints: none", Int("processes", 8), Int("calls_during_pause", 160)),
		row("hints: bus", Int("processes", 8), Int("calls_during_pause", 1)),
	}}
	var buf bytes.Buffer
	if err := WriteReport(&buf, []*Result{r}, time.Second); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	if n := strings.Count(page, "<table>"); n != 3 {
		t.Fatalf("%d tables, want 3 (limiter, semaphore, hints)", n)
	}
	for _, want := range []string{"<th>processes</th><th>admitted_rps</th><th>p99_added_us</th></tr>", "<th>processes</th><th>calls</th><th>max_in_flight</th></tr>",
		"<th>processes</th><th>calls_during_pause</th></tr>\n<tr><td>hints: none</td><td>8</td><td>160</td></tr><tr><td>hints: bus</td>"} {
		if !strings.Contains(page, want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
