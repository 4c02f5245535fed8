package lab

import (
	_ "embed"
	"encoding/json"
	"html/template"
	"io"
	"math"
	"slices"
	"strconv"
	"time"
)

// chartJS is Chart.js (MIT licence, see assets/chart.js.LICENSE.md), inlined
// so the report opens offline.
//
//go:embed assets/chart.umd.min.js
var chartJS string

var reportTmpl = template.Must(template.New("report").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>guardrail lab report</title>
<style>
body{font:15px/1.45 system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd}
table{border-collapse:collapse;margin:1em 0;font-size:.92em}
td,th{border:1px solid #ddd;padding:.3em .6em;text-align:right}td:first-child,th:first-child{text-align:left}
.ok{color:#1a7f37}.fail{color:#cf222e;font-weight:bold}.unjudged{color:#8a6d00}.note{color:#555}
.chart{position:relative;height:340px;margin:1em 0}
.wide{overflow-x:auto;max-width:100%}.wide table{white-space:nowrap}
.summary{border:1px solid #ddd;border-radius:6px;padding:.6em 1em;margin:1em 0}
.summary .counts{font-size:1.15em;margin:.2em 0 .4em}.summary ul{margin:.3em 0}
</style>
<script>{{.JS}}</script>
</head><body>
<h1>guardrail lab</h1>
<p class="note">Generated {{.When}}, {{.Took}} in all. Every number below was measured on real loopback HTTP servers
(the jitter experiment is a discrete simulation).</p>
<div class="summary" id="summary">
<p class="counts"><span class="ok">{{.Summary.Pass}} passed</span>, <span class="{{if .Summary.Fail}}fail{{else}}note{{end}}">{{.Summary.Fail}} failed</span>,
<span class="unjudged">{{.Summary.NotJudged}} not judged</span> (the machine was too busy to measure them; they neither pass nor fail)</p>
{{if .Summary.Listed}}<ul>{{range .Summary.Listed}}<li class="{{.Verdict.Class}}">{{.Verdict.Symbol}} <a href="#{{.Anchor}}">{{.Experiment}}</a>: {{.Name}}</li>{{end}}</ul>{{end}}
</div>
{{range $i, $r := .Results}}
<h2 id="{{$r.Anchor}}">{{$r.Experiment}}: {{$r.Title}}</h2>
{{range $r.Tables}}<div class="wide"><table><tr><th>row</th>{{range .Header}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr><td>{{.Label}}</td>{{range .Cells}}<td>{{.Text}}{{if .Judged}} <span class="{{.Verdict.Class}}" title="{{.Verdict.Title}}">{{.Verdict.CellMark}}</span>{{end}}</td>{{end}}</tr>{{end}}
</table></div>{{end}}
{{range $r.Notes}}<p class="note">{{.}}</p>{{end}}
<ul>{{range $r.Checks}}<li class="{{.Verdict.Class}}">{{.Verdict.Symbol}} {{.Name}}: {{.Detail}}</li>{{end}}</ul>
{{range $j, $c := $r.Charts}}<div class="chart"><canvas id="c{{$i}}_{{$j}}"></canvas></div>{{end}}
{{end}}
<script>
const charts = {{.Charts}};
// The palette holds none of the outcome colours below, so that no series
// reads as success or refusal by sharing their colour.
const palette = ['#0969da','#e16f24','#1b7c83','#bf3989','#57606a','#953800','#0598bc','#a40e26','#6e7b00','#0a3069'];
// A series keeps its colour in every chart of the report: colours go to
// names in the order they first appear, not to positions in a chart.
// Outcomes read at a glance: success green, refusal red, timeout amber.
const colours = new Map([['200', '#1a7f37'], ['ok', '#1a7f37'], ['503', '#cf222e'], ['shed', '#cf222e'],
  ['timeout', '#bf8700'], ['late', '#bf8700'], ['error', '#8250df']]);
const semantic = colours.size;
const colourOf = name => {
  if (!colours.has(name)) colours.set(name, palette[(colours.size - semantic) % palette.length]);
  return colours.get(name);
};
// A point that never came (a run that never recovered) has no value to
// draw: a hatched column across the plot in its series' colour, under a
// marker at the top labelled "never", not a bar of some stand-in number.
const neverMarks = {id: 'never', afterDatasetsDraw(ch) {
  const a = ch.chartArea, g = ch.ctx, bar = ch.config.type === 'bar';
  ch.$never = [];
  ch.data.datasets.forEach((ds, k) => {
    if (!ds.never || !ch.isDatasetVisible(k)) return;
    const meta = ch.getDatasetMeta(k);
    ds.never.forEach((never, i) => {
      if (!never) return;
      const el = meta.data[i];
      const x = el && Number.isFinite(el.x) ? el.x : ch.scales.x.getPixelForValue(i);
      if (bar) {
        const w = el && Number.isFinite(el.width) && el.width > 0 ? el.width : 12;
        g.save();
        g.beginPath();
        g.rect(x - w / 2, a.top, w, a.bottom - a.top);
        g.clip();
        g.strokeStyle = ds.colour + '88';
        g.lineWidth = 1.5;
        g.beginPath();
        for (let y = a.top; y < a.bottom + w; y += 7) { g.moveTo(x - w / 2, y); g.lineTo(x + w / 2, y - w); }
        g.stroke();
        g.restore();
      }
      g.save();
      g.fillStyle = ds.colour;
      g.beginPath();
      g.moveTo(x, a.top + 1); g.lineTo(x - 7, a.top + 12); g.lineTo(x + 7, a.top + 12);
      g.closePath();
      g.fill();
      g.font = 'bold 12px system-ui, sans-serif';
      g.textAlign = 'center';
      g.textBaseline = 'top';
      g.fillStyle = '#222';
      g.fillText('never', x, a.top + 14);
      g.restore();
      ch.$never.push({dataset: k, index: i, x: x, y: a.top + 8});
    });
  });
}};
const nj = t => !!(t.dataset.nj && t.dataset.nj[t.dataIndex]);
// The key to the marks a chart uses, under its title.
const key = c => {
  const parts = [];
  if (c.series.some(s => s.never)) parts.push('▲ never: no value before the run ended');
  if (c.series.some(s => s.nj)) parts.push('faded: not judged (see the checks above)');
  return {display: parts.length > 0, text: parts.join('   ·   ')};
};
for (const c of charts) {
  const el = document.getElementById(c.id);
  const stepped = c.kind === 'stepped';
  // A numeric x draws each point at its value on a linear axis, so a gap
  // of 1 ms and one of 1,000 ms are not drawn the same width.
  const numeric = Array.isArray(c.xnum);
  const y = {type: c.logy ? 'logarithmic' : 'linear', title: {display: !!c.ylabel, text: c.ylabel}, beginAtZero: !c.logy,
             ticks: c.ycat ? {stepSize: 1, callback: v => c.ycat[v] ?? v} : {}};
  if (c.logy) {
    // Left to itself the log axis starts near the smallest value, which
    // leaves that bar no height at all: start a decade below it.
    const pos = c.series.flatMap(s => s.values).filter(v => v > 0);
    if (pos.length) y.min = Math.pow(10, Math.floor(Math.log10(Math.min(...pos))) - 1);
    // A tick per decade, written as a number (10, 0.01), not with the
    // decimals of the smallest one (10.000): in between they crowd.
    y.ticks = {callback: v => {
      const m = v / Math.pow(10, Math.floor(Math.log10(v) + 1e-9));
      return Math.abs(m - 1) < 1e-6 ? String(Number(v.toPrecision(3))) : '';
    }};
  }
  const x = {title: {display: !!c.xlabel, text: c.xlabel}};
  if (numeric) {
    x.type = 'linear';
    x.min = Math.min(...c.xnum);
    x.max = Math.max(...c.xnum);
  }
  const bar = c.kind === 'bar';
  new Chart(el, {
    type: bar ? 'bar' : 'line',
    data: {labels: numeric ? undefined : c.x, datasets: c.series.map((s, k) => {
      // A band (an outage window) is shaded, not coloured: it takes no
      // colour from the palette's series.
      const colour = s.fill ? '#cf222e' : colourOf(s.name);
      // Points whose rows were not judged are drawn faded (a bar a quarter
      // filled inside its outline, a faded dashed line into a point):
      // there, but not evidence.
      const nj = i => !!(s.nj && s.nj[i]);
      const solid = colour + (bar ? 'cc' : '33');
      const ds = {
        label: s.name + (s.njAll ? ' (not judged)' : ''), colour: colour, never: s.never, nj: s.nj,
        data: numeric ? s.values.map((v, i) => ({x: c.xnum[i], y: v})) : s.values,
        borderColor: s.fill ? 'rgba(207,34,46,0.15)' : (s.njAll ? colour + '55' : colour),
        backgroundColor: s.fill ? 'rgba(207,34,46,0.15)' : (s.nj ? s.values.map((v, i) => nj(i) ? colour + '40' : solid) : solid),
        stepped: stepped || !!s.fill, fill: !!s.fill, pointRadius: stepped ? 3 : 0,
        borderWidth: s.fill ? 0 : 2, tension: 0};
      if (s.nj && !bar) {
        ds.segment = {borderColor: g => nj(g.p1DataIndex) ? colour + '55' : undefined,
                      borderDash: g => nj(g.p1DataIndex) ? [6, 4] : undefined};
        if (s.njAll) ds.borderDash = [6, 4];
      }
      return ds;
    })},
    plugins: [neverMarks],
    options: {responsive: true, maintainAspectRatio: false, animation: false,
      plugins: {title: {display: true, text: c.title}, subtitle: key(c),
        tooltip: {callbacks: {afterLabel: t => nj(t) ? 'not judged: see the checks above the chart' : ''}}},
      scales: {x: x, y: y}}
  });
}
</script>
</body></html>
`))

type reportChart struct {
	ID     string    `json:"id"`
	Title  string    `json:"title"`
	Kind   string    `json:"kind"`
	XLabel string    `json:"xlabel"`
	YLabel string    `json:"ylabel"`
	X      []string  `json:"x"`
	Series []jSeries `json:"series"`
	XNum   []float64 `json:"xnum,omitempty"`
	YCat   []string  `json:"ycat,omitempty"`
	LogY   bool      `json:"logy,omitempty"`
}

type jSeries struct {
	Name string `json:"name"`
	// Values holds null for a point not drawn at a value: never, or not
	// a number (which JSON cannot carry, and which would otherwise fail
	// the whole report).
	Values    []*float64 `json:"values"`
	Fill      bool       `json:"fill,omitempty"`
	Never     []bool     `json:"never,omitempty"`
	NotJudged []bool     `json:"nj,omitempty"`
	// AllNotJudged: every point is, so the legend says so.
	AllNotJudged bool `json:"njAll,omitempty"`
}

func toJSeries(s Series) jSeries {
	j := jSeries{Name: s.Name, Fill: s.Fill, Values: make([]*float64, len(s.Values))}
	anyNever, anyNJ, allNJ := false, false, len(s.Values) > 0
	for i, v := range s.Values {
		never := i < len(s.Never) && s.Never[i]
		nj := i < len(s.NotJudged) && s.NotJudged[i]
		anyNever, anyNJ, allNJ = anyNever || never, anyNJ || nj, allNJ && nj
		if !never && !math.IsNaN(v) && !math.IsInf(v, 0) {
			j.Values[i] = &v
		}
	}
	if anyNever {
		j.Never = make([]bool, len(s.Values))
		copy(j.Never, s.Never)
	}
	if anyNJ {
		j.NotJudged = make([]bool, len(s.Values))
		copy(j.NotJudged, s.NotJudged)
	}
	j.AllNotJudged = allNJ
	return j
}

type reportRow struct {
	Label string
	Cells []reportCell
}

// reportCell is a table cell: a value, and the verdict it was held to,
// if any.
type reportCell struct {
	Text    string
	Judged  bool
	Verdict Verdict
}

type reportResult struct {
	*Result
	Anchor string // the id of its section
	Tables []reportTable
}

// reportTable is one table of a result: rows that share most of their
// columns.
type reportTable struct {
	Header []string
	Rows   []reportRow
}

// shownKeys returns the keys of the columns a row shows in the tables.
func shownKeys(row Row) []string {
	var keys []string
	for _, c := range row.Cols {
		if !c.JSONOnly {
			keys = append(keys, c.Key)
		}
	}
	return keys
}

// tableGroups splits rows into runs that share columns: a row starts a
// new table when at most half of its columns are in the current one.
// An experiment whose rows measure different things (a limiter, a
// semaphore, hints) gets a narrow table for each, not one wide table of
// mostly empty cells.
func tableGroups(rows []Row) [][]Row {
	var groups [][]Row
	var keys []string
	for _, row := range rows {
		own := shownKeys(row)
		shared := 0
		for _, k := range own {
			if slices.Contains(keys, k) {
				shared++
			}
		}
		if len(groups) == 0 || 2*shared <= len(own) {
			groups = append(groups, nil)
			keys = nil
		}
		groups[len(groups)-1] = append(groups[len(groups)-1], row)
		for _, k := range own {
			if !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	return groups
}

// summary counts the checks of a report by verdict and lists the ones
// that did not pass, first the failures, each linked to its section.
type summary struct {
	Pass, Fail, NotJudged int
	Listed                []listedCheck
}

type listedCheck struct {
	Check
	Experiment, Anchor string
}

func summarize(rs []reportResult) summary {
	var s summary
	var unjudged []listedCheck
	for _, r := range rs {
		for _, c := range r.Checks {
			l := listedCheck{c, r.Experiment, r.Anchor}
			switch c.Verdict {
			case Pass:
				s.Pass++
			case Fail:
				s.Fail++
				s.Listed = append(s.Listed, l)
			default:
				s.NotJudged++
				unjudged = append(unjudged, l)
			}
		}
	}
	s.Listed = append(s.Listed, unjudged...)
	return s
}

// WriteReport writes a self-contained HTML page with every result's table,
// checks and charts. It needs no network to open.
func WriteReport(w io.Writer, results []*Result, took time.Duration) error {
	var rs []reportResult
	var charts []reportChart
	for i, r := range results {
		rr := reportResult{Result: r, Anchor: "exp-" + strconv.Itoa(i) + "-" + r.Experiment}
		for _, group := range tableGroups(r.Rows) {
			var t reportTable
			// A column is headed by its name in the text table, or by its
			// key where rows name it differently ("vs plain", "vs
			// plain+headers").
			var keys []string
			for _, row := range group {
				for _, c := range row.Cols {
					if c.JSONOnly {
						continue // as in the text table: the row label says it
					}
					k := slices.Index(keys, c.Key)
					if k < 0 {
						keys = append(keys, c.Key)
						t.Header = append(t.Header, c.name())
					} else if t.Header[k] != c.name() {
						t.Header[k] = Col{Key: c.Key, Value: c.Value}.name()
					}
				}
			}
			for _, row := range group {
				cells := make([]reportCell, len(keys))
				for _, c := range row.Cols {
					if k := slices.Index(keys, c.Key); k >= 0 {
						cells[k] = reportCell{Text: c.value(), Judged: c.judged, Verdict: c.verdict}
					}
				}
				t.Rows = append(t.Rows, reportRow{row.Label, cells})
			}
			rr.Tables = append(rr.Tables, t)
		}
		rs = append(rs, rr)
		for j, c := range r.Charts {
			rc := reportChart{ID: chartID(i, j), Title: c.Title, Kind: c.Kind, XLabel: c.XLabel, YLabel: c.YLabel, X: c.X, XNum: c.XValues, YCat: c.YCategories, LogY: c.LogY}
			for _, s := range c.Series {
				rc.Series = append(rc.Series, toJSeries(s))
			}
			charts = append(charts, rc)
		}
	}
	chartsJSON, err := json.Marshal(charts)
	if err != nil {
		return err
	}
	return reportTmpl.Execute(w, map[string]any{
		"JS":      template.JS(chartJS),
		"Charts":  template.JS(chartsJSON),
		"Results": rs,
		"Summary": summarize(rs),
		"When":    time.Now().Format(time.RFC1123),
		"Took":    took.Round(100 * time.Millisecond),
	})
}

// Class is the verdict's CSS class in the HTML report.
func (v Verdict) Class() string {
	switch v {
	case Pass:
		return "ok"
	case Fail:
		return "fail"
	}
	return "unjudged"
}

// CellMark is the verdict's mark next to a judged number in the HTML
// report's tables.
func (v Verdict) CellMark() string {
	switch v {
	case Pass:
		return "✓"
	case Fail:
		return "✗"
	}
	return "– not judged"
}

// Title is the verdict's tooltip next to a judged number.
func (v Verdict) Title() string {
	switch v {
	case Pass:
		return "within its target: the check passed"
	case Fail:
		return "misses its target: the check failed"
	}
	return "not judged: see the checks below the table"
}

// Symbol is the verdict's mark in the HTML report.
func (v Verdict) Symbol() string {
	switch v {
	case Pass:
		return "✓"
	case Fail:
		return "✗"
	}
	return "– not judged:"
}

func chartID(i, j int) string { return "c" + strconv.Itoa(i) + "_" + strconv.Itoa(j) }
