// Package lab runs the experiments of `guardrail lab`: the failures that take
// services down (retry storms, a dead dependency, a slow one, lost responses,
// overload) reproduced on real loopback HTTP servers (and one simulation),
// each printing its numbers and checking that the guardrail did what it
// should.
package lab

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Experiment is one lab experiment.
type Experiment struct {
	// Name is what `guardrail lab NAME` selects.
	Name string
	// Summary is one line for the experiment list.
	Summary string
	// Light marks an experiment that may run alongside the other light
	// ones: its load is a few requests at a time, and its checks count
	// calls or time against margins far wider than a busy machine's
	// stalls (its own timing rule still judges those).
	Light bool
	// Setup binds the experiment's parameters to fs, with defaults shrunk
	// when quick is set, and returns the function that runs it with them.
	Setup func(fs *flag.FlagSet, quick bool) Run

	// bind binds the parameters to fs as Setup does and returns them, so
	// that their validation runs without the experiment.
	bind func(fs *flag.FlagSet, quick bool) flagged
}

// flagged is an experiment's parameters, bound to its flags.
type flagged interface {
	// checkFlags returns a FlagError naming every flag the experiment
	// cannot run with, or nil. It starts nothing.
	checkFlags() error
	run(ctx context.Context, env *Env) (*Result, error)
}

// bound returns e with its Setup made from its bind: the Run checks the
// flags before it starts anything.
func bound(e Experiment) Experiment {
	bind := e.bind
	e.Setup = func(fs *flag.FlagSet, quick bool) Run {
		p := bind(fs, quick)
		return func(ctx context.Context, env *Env) (*Result, error) {
			if err := p.checkFlags(); err != nil || CheckingOnly(ctx) {
				return nil, err
			}
			return p.run(ctx, env)
		}
	}
	return e
}

// Run runs an experiment once.
type Run func(ctx context.Context, env *Env) (*Result, error)

type checkOnlyKey struct{}

// CheckFlags returns the *FlagError run returns for the flags it was set up
// with, or nil, and starts nothing: the lab checks every selected
// experiment's flags before it runs the first.
func CheckFlags(run Run) error {
	_, err := run(context.WithValue(context.Background(), checkOnlyKey{}, true), nil)
	return err
}

// CheckingOnly reports whether ctx is CheckFlags's: a Run given it returns
// after checking its flags.
func CheckingOnly(ctx context.Context) bool { return ctx.Value(checkOnlyKey{}) != nil }

// FlagError is the error of a Run whose flags hold values it cannot run
// with; the command reports it as a bad command line, not a failure.
type FlagError struct{ Msg string }

func (e *FlagError) Error() string { return e.Msg }

func flagErrorf(format string, args ...any) error {
	return &FlagError{Msg: fmt.Sprintf(format, args...)}
}

// Env is what an experiment gets from the runner.
type Env struct {
	// Quick asks for shorter durations (CI smoke runs).
	Quick bool
	// Seed drives every random draw of the experiment.
	Seed uint64
	// Progress reports what is happening; it never blocks.
	Progress func(format string, args ...any)
}

// Result is what an experiment measured.
type Result struct {
	Experiment string
	Title      string   // what the experiment shows, with its parameters
	Rows       []Row    // the table, in order
	Notes      []string // printed under the table
	Checks     []Check  // what the guardrail should have done
	Charts     []Chart  // for the HTML report
	Took       time.Duration
}

// Row is one line of a result table.
type Row struct {
	Label string
	Cols  []Col
}

// Col is one measured value. Key names it in JSON; Name (default Key) in
// the table, with Format applied to Value.
//
// A duration is a number of milliseconds in JSON, under a key ending in
// _ms; in the tables it carries its own unit, rounded to 3 significant
// digits (532ms, 1.26s, 32.7s), and its name drops the _ms, so that a name
// never states a unit its value does not have. Format does not apply to it.
type Col struct {
	Key    string
	Name   string
	Value  any // int, int64, float64, bool, string, time.Duration (as ms), nil ("none")
	Format string
	// JSONOnly leaves the column out of the table (the row label says it).
	JSONOnly bool

	// judged marks the value with verdict in the tables, for a number
	// held against a target.
	judged  bool
	verdict Verdict
}

// Int is an integer column.
func Int(key string, v int) Col { return Col{Key: key, Value: v, Format: "%d"} }

// Float is a float column printed with prec decimals.
func Float(key string, v float64, prec int) Col {
	return Col{Key: key, Value: v, Format: fmt.Sprintf("%%.%df", prec)}
}

// Ms is a duration column: milliseconds in the table and in JSON.
func Ms(key string, d time.Duration) Col { return Col{Key: key, Value: d, Format: "ms"} }

// Bool is a boolean column.
func Bool(key string, v bool) Col { return Col{Key: key, Value: v, Format: "%v"} }

// Str is a string column.
func Str(key string, v string) Col { return Col{Key: key, Value: v, Format: "%s"} }

// As sets the column's name in the table and its format ("ms" or "s" for
// durations, a fmt verb otherwise).
func (c Col) As(name, format string) Col { c.Name, c.Format = name, format; return c }

// Named sets the column's name in the table.
func (c Col) Named(name string) Col { c.Name = name; return c }

func (c Col) jsonOnly() Col { c.JSONOnly = true; return c }

// judgedAs marks the value with v in the tables: the check that held it
// against its target passed, failed or could not judge it.
func (c Col) judgedAs(v Verdict) Col            { c.judged, c.verdict = true, v; return c }
func row(label string, cols ...Col) Row         { return Row{Label: label, Cols: cols} }
func (r *Result) add(label string, cols ...Col) { r.Rows = append(r.Rows, row(label, cols...)) }
func (r *Result) note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// Verdict is what a check concluded about the experiment's numbers.
type Verdict int

const (
	// Pass: the numbers show the guardrail doing what it should.
	Pass Verdict = iota
	// Fail: the numbers contradict what the guardrail should do; the lab
	// exits 1.
	Fail
	// NotJudged: the run could not produce numbers to judge (the machine
	// was too busy to keep a load on schedule, say). It neither passes nor
	// fails, and leaves the exit code alone.
	NotJudged
)

// String returns the verdict as the JSON output spells it: "pass", "fail"
// or "not_judged".
func (v Verdict) String() string {
	switch v {
	case Pass:
		return "pass"
	case Fail:
		return "fail"
	case NotJudged:
		return "not_judged"
	}
	return fmt.Sprintf("Verdict(%d)", int(v))
}

// mark is the verdict in the table.
func (v Verdict) mark() string {
	switch v {
	case Pass:
		return "pass"
	case Fail:
		return "FAIL"
	}
	return "not judged"
}

// Check is one assertion about an experiment's own numbers: the lab exits
// 1 when one fails, since the guardrail did not do its job.
type Check struct {
	Name    string
	Verdict Verdict
	Detail  string
}

// check records a judged check: Pass when ok, else Fail.
func (r *Result) check(ok bool, name string, detailFormat string, args ...any) {
	v := Fail
	if ok {
		v = Pass
	}
	r.Checks = append(r.Checks, Check{Name: name, Verdict: v, Detail: fmt.Sprintf(detailFormat, args...)})
}

// notJudged records a check the run could not judge, with the reason.
func (r *Result) notJudged(name string, detailFormat string, args ...any) {
	r.Checks = append(r.Checks, Check{Name: name, Verdict: NotJudged, Detail: fmt.Sprintf(detailFormat, args...)})
}

// Failed returns the checks that failed; not judged ones are not among them.
func (r *Result) Failed() []Check { return r.with(Fail) }

// NotJudged returns the checks the run could not judge.
func (r *Result) NotJudged() []Check { return r.with(NotJudged) }

func (r *Result) with(v Verdict) []Check {
	var out []Check
	for _, c := range r.Checks {
		if c.Verdict == v {
			out = append(out, c)
		}
	}
	return out
}

// Chart is a picture for the HTML report.
type Chart struct {
	Title  string
	Kind   string // "bar", "line", "stepped" (a state timeline)
	XLabel string
	YLabel string
	// X labels the points of a categorical axis: evenly spaced whatever
	// they say. Leave it empty when XValues is set.
	X []string
	// XValues, when set, places point i at XValues[i] on a linear axis, so
	// the gaps between points are drawn to scale (a time axis). It has
	// one value per point of every series.
	XValues []float64
	Series  []Series
	// YCategories, when set, names the integer levels of a stepped chart
	// (0 closed, 1 half-open, 2 open).
	YCategories []string
	// LogY draws the y axis on a log scale, for values spanning decades.
	LogY bool
}

// Series is one line or set of bars.
type Series struct {
	Name   string
	Values []float64
	// Fill shades the area under the series, as a band (an outage window),
	// drawn as steps rather than a line.
	Fill bool
	// Never marks the points whose value never came (a run that never
	// recovered before it ended): each is drawn as a marker labelled
	// "never" at the top of the plot, not as a bar or point of its value,
	// which is ignored. Nil, or shorter than Values: no such point.
	Never []bool
	// NotJudged marks the points whose rows' checks were not judged (a
	// machine too busy to measure them, a race build): they are drawn
	// faded and say "not judged" in their tooltip; when every point is,
	// the legend says it too. Nil: every point was judged.
	NotJudged []bool
}

// notJudgedIf returns s with every point marked not judged unless judged:
// for a series that draws one row.
func (s Series) notJudgedIf(judged bool) Series {
	if !judged {
		s.NotJudged = make([]bool, len(s.Values))
		for i := range s.NotJudged {
			s.NotJudged[i] = true
		}
	}
	return s
}

// name is the column's name in the tables: a duration's drops the _ms
// of its key, since its value carries its unit.
func (c Col) name() string {
	name := c.Name
	if name == "" {
		name = c.Key
	}
	switch c.Value.(type) {
	case time.Duration, nil:
		name = strings.TrimSuffix(name, "_ms")
	}
	return name
}

// value renders the column's value for the tables, without its verdict.
func (c Col) value() string {
	switch x := c.Value.(type) {
	case time.Duration:
		return fmtDur(x)
	case nil:
		return "none"
	default:
		f := c.Format
		if f == "" {
			f = "%v"
		}
		return fmt.Sprintf(f, x)
	}
}

// text renders a column for the text table: name=value, and the verdict
// of a judged value in brackets as the checks spell it, +17.7%[FAIL].
func (c Col) text() string {
	v := c.name() + "=" + c.value()
	if c.judged {
		v += "[" + c.verdict.mark() + "]"
	}
	return v
}

// fmtDur rounds d for display to 3 significant digits, in the largest
// unit under it: 532ms, 1.26s, 32.7s, 85µs; from 1,000 s on, in seconds.
func fmtDur(d time.Duration) string {
	if d < 0 {
		// -MinInt64 overflows; a nanosecond is below what is shown.
		return "-" + fmtDur(-max(d, -math.MaxInt64))
	}
	// Round first, so that 999.6ms carries into 1s, not 1000ms.
	if digits := len(strconv.FormatInt(int64(d), 10)); digits > 3 {
		d = d.Round(time.Duration(math.Pow10(digits - 3)))
	}
	for _, u := range []struct {
		size time.Duration
		name string
	}{{time.Second, "s"}, {time.Millisecond, "ms"}, {time.Microsecond, "µs"}, {1, "ns"}} {
		if d >= u.size {
			v := float64(d) / float64(u.size)
			s := strconv.FormatFloat(v, 'f', max(0, 2-int(math.Floor(math.Log10(v)))), 64)
			if strings.Contains(s, ".") {
				s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
			}
			return s + u.name
		}
	}
	return "0s"
}

// jsonValue renders a column value for JSON: durations in milliseconds.
func (c Col) jsonValue() any {
	switch x := c.Value.(type) {
	case time.Duration:
		return math.Round(float64(x)/float64(time.Millisecond)*10) / 10
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return nil
		}
		return x
	}
	return c.Value
}

// WriteTable prints r as text: a label padded to the widest, then key=value
// columns, then the notes and the checks with their verdicts.
func WriteTable(w io.Writer, r *Result) {
	fmt.Fprintf(w, "\n== %s: %s\n", r.Experiment, r.Title)
	width := 0
	for _, row := range r.Rows {
		width = max(width, len(row.Label))
	}
	for _, row := range r.Rows {
		parts := make([]string, 0, len(row.Cols))
		for _, c := range row.Cols {
			if !c.JSONOnly {
				parts = append(parts, c.text())
			}
		}
		fmt.Fprintf(w, "%-*s  %s\n", width, row.Label, strings.Join(parts, " "))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  %s\n", n)
	}
	for _, c := range r.Checks {
		fmt.Fprintf(w, "  [%s] %s: %s\n", c.Verdict.mark(), c.Name, c.Detail)
	}
}

// WriteJSON writes one JSON object per row,
// {"experiment": ..., "row": label, key: value, ...}, then one per check,
// {"experiment": ..., "check": name, "verdict": "pass" | "fail" |
// "not_judged", "detail": ...}.
func WriteJSON(w io.Writer, r *Result) error {
	enc := json.NewEncoder(w)
	for _, row := range r.Rows {
		obj := orderedObject{{"experiment", r.Experiment}, {"row", row.Label}}
		for _, c := range row.Cols {
			obj = append(obj, kv{c.Key, c.jsonValue()})
		}
		if err := enc.Encode(obj); err != nil {
			return err
		}
	}
	for _, c := range r.Checks {
		obj := orderedObject{{"experiment", r.Experiment}, {"check", c.Name}, {"verdict", c.Verdict.String()}, {"detail", c.Detail}}
		if err := enc.Encode(obj); err != nil {
			return err
		}
	}
	return nil
}

type kv struct {
	k string
	v any
}

// orderedObject marshals as a JSON object keeping column order.
type orderedObject []kv

func (o orderedObject) MarshalJSON() ([]byte, error) {
	var b strings.Builder
	b.WriteByte('{')
	for i, f := range o {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(f.k)
		v, err := json.Marshal(f.v)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return []byte(b.String()), nil
}

// Experiments returns every experiment in the order `guardrail lab` runs them.
func Experiments() []Experiment {
	return []Experiment{
		amplification(),
		jitter(),
		deadlineExp(),
		breakerExp(),
		retryAfter(),
		idempotencyExp(),
		shedding(),
		hedging(),
		throttling(),
		incident(),
		metastableExp(),
		chainExp(),
		fleetExp(),
		overhead(),
	}
}

// Lookup finds an experiment by name.
func Lookup(name string) (Experiment, bool) {
	for _, e := range Experiments() {
		if e.Name == name {
			return e, true
		}
	}
	return Experiment{}, false
}

// Names lists the experiments' names, sorted.
func Names() []string {
	var out []string
	for _, e := range Experiments() {
		out = append(out, e.Name)
	}
	sort.Strings(out)
	return out
}
