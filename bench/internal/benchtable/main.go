// Command benchtable turns the output of the comparison benchmarks into
// Markdown tables, one per group of rows that measure the same thing, with
// each row's median, its confidence interval as benchstat reports it, and
// its ratio to the group's baseline measured in the same run.
//
// A benchmark's name holds key=value parts; the part impl=... names the
// row, the other parts name the group:
//
//	BenchmarkBreaker/state=closed/impl=gobreaker-execute/run=seq-2
//	-> group Breaker/state=closed/run=seq, row gobreaker-execute
//
// Usage:
//
//	benchtable [-machine machine.txt] [-readme README.md] raw.txt...
//
// With -readme it replaces the part of that file between the lines
// "<!-- benchtable:start -->" and "<!-- benchtable:end -->" instead of
// printing.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"os"
	"regexp"
	"strings"

	"golang.org/x/perf/benchfmt"
	"golang.org/x/perf/benchmath"
)

// baselines names, for each group prefix, the row the others are compared
// with; a group that matches none is compared with its first row.
var baselines = []struct{ prefix, impl string }{
	{"Breaker/", "gobreaker-execute"},
	{"Retry", "failsafe-executor"},
	{"Composed/timeout=none/", "failsafe-retry-cb"},
	{"Composed/timeout=1s/", "baseline-withtimeout"},
	{"Bulkhead/", "semaphore-acquire"},
	{"HTTP", "plain"},
	{"Clock", "time-now"},
}

// notes are the like-for-like caveats printed beside a row.
var notes = map[string]string{
	"guardrail-allow-done":             "time window, slow-call tracking off: Allow reads no clock, Done one monotonic read",
	"guardrail-execute-slowcall":       "slow-call tracking on (Config.SlowCall): Execute times the call, two monotonic clock reads",
	"gobreaker-execute":                "two mutex sections and two time.Now per call; a 10 s window of 1 s buckets",
	"gobreaker-twostep":                "the done func is a closure: 1 allocation per call",
	"failsafe-executor":                "the policy run through failsafe.With(...).Get",
	"failsafe-manual":                  "TryAcquirePermit + RecordSuccess; the user must not forget the record",
	"eapache-run":                      "does less: records nothing while closed, trips on 20 errors with no quiet period of the open time between them (no rate, no window); each opening starts a goroutine that sleeps for the open time",
	"guardrail-do":                     "",
	"direct":                           "the operation called without any library: the floor",
	"cenkalti-retry":                   "a new ExponentialBackOff per call: it holds the call's retry state",
	"eapache-retrier":                  "retry only; no budget, no breaker",
	"failsafe-retry-cb":                "no retry budget",
	"failsafe-retry-budget-cb":         "failsafe's budget caps retries in flight (Envoy style), not a token bucket (gRPC style); it is touched only on a retry",
	"baseline-withtimeout":             "context.WithTimeout + cancel around the operation, nothing else",
	"guardrail-do-parent-sooner":       "the caller's deadline comes before the attempt timeout: no timer, a WithCancel",
	"failsafe-retry-cb-timeout":        "timeout innermost (per attempt); the op reads its context from the Execution",
	"failsafe-retry-budget-cb-timeout": "as above, with failsafe's retry budget",
	"guardrail-acquire":                "Config{MaxConcurrent: 64, MaxQueue: 64, MaxWait: 1s}",
	"failsafe-acquire-maxwait":         "AcquirePermitWithMaxWait(ctx, 1s): a buffered channel",
	"failsafe-try-acquire":             "TryAcquirePermit: never waits",
	"semaphore-acquire":                "golang.org/x/sync/semaphore.Weighted: no queue bound, no max wait",
	"semaphore-try-acquire":            "TryAcquire: never waits",
	"plain":                            "http.Client over the shared transport settings",
	"guardhttp":                        "guardhttp.NewClient(guardhttp.Config{}): retry, budget, breaker per host, phase timeouts, deadline headers",
	"failsafehttp":                     "its HTTP retry policy + one circuit breaker for the client (no breaker per host), no timeouts",
	"retryablehttp":                    "StandardClient, 2 retries, logger off; no breaker, no budget",
	"time-now":                         "one time.Now(): the floor under any time-window breaker",
}

// note refines notes by group: the same implementation name means
// different things in different benchmarks.
func note(group, impl string) string {
	if impl == "guardrail-do" {
		switch {
		case strings.HasPrefix(group, "Retry"):
			return "retry + guardrail's retry budget (the peers have no budget), breaker off"
		case strings.HasPrefix(group, "Composed/timeout=none"):
			return "the zero Policy: retry + budget + breaker"
		case strings.HasPrefix(group, "Composed/timeout=1s"):
			return "Policy{AttemptTimeout: 1s}: retry + budget + breaker + attempt timeout"
		}
	}
	if impl == "guardhttp" && strings.HasPrefix(group, "HTTP/deadline=1h") {
		return notes[impl] + "; with a deadline it also writes X-Request-Timeout and X-Request-Deadline"
	}
	return notes[impl]
}

type row struct {
	impl   string
	values map[string][]float64 // by unit as written by the benchmark
	units  []string             // in order of appearance
}

type group struct {
	name   string
	rows   []*row
	byImpl map[string]*row
}

var procsSuffix = regexp.MustCompile(`-\d+$`)

func main() {
	machine := flag.String("machine", "", "file describing the machine, printed before the tables")
	readme := flag.String("readme", "", "replace the marked part of this file instead of printing")
	flag.Parse()
	if flag.NArg() == 0 {
		log.Fatal("usage: benchtable [-machine file] [-readme README.md] raw.txt...")
	}
	groups, err := read(flag.Args())
	if err != nil {
		log.Fatal(err)
	}
	var out bytes.Buffer
	if *machine != "" {
		m, err := os.ReadFile(*machine)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Fprintf(&out, "```\n%s```\n\n", m)
	}
	render(&out, groups)
	if *readme == "" {
		os.Stdout.Write(out.Bytes())
		return
	}
	if err := replace(*readme, out.Bytes()); err != nil {
		log.Fatal(err)
	}
}

func read(files []string) ([]*group, error) {
	var groups []*group
	byName := map[string]*group{}
	for _, name := range files {
		f, err := os.Open(name)
		if err != nil {
			return nil, err
		}
		r := benchfmt.NewReader(f, name)
		for r.Scan() {
			res, ok := r.Result().(*benchfmt.Result)
			if !ok {
				continue
			}
			gname, impl := split(res.Name.String())
			g := byName[gname]
			if g == nil {
				g = &group{name: gname, byImpl: map[string]*row{}}
				byName[gname] = g
				groups = append(groups, g)
			}
			rw := g.byImpl[impl]
			if rw == nil {
				rw = &row{impl: impl, values: map[string][]float64{}}
				g.byImpl[impl] = rw
				g.rows = append(g.rows, rw)
			}
			for _, v := range res.Values {
				unit, val := v.Unit, v.Value
				if v.OrigUnit != "" {
					unit, val = v.OrigUnit, v.OrigValue
				}
				if _, seen := rw.values[unit]; !seen {
					rw.units = append(rw.units, unit)
				}
				rw.values[unit] = append(rw.values[unit], val)
			}
		}
		err = r.Err()
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	if len(groups) == 0 {
		return nil, errors.New("no benchmark results")
	}
	return groups, nil
}

// split returns the group and the implementation of a benchmark name.
func split(name string) (group, impl string) {
	name = procsSuffix.ReplaceAllString(name, "")
	var rest []string
	for _, p := range strings.Split(name, "/") {
		if v, ok := strings.CutPrefix(p, "impl="); ok {
			impl = v
			continue
		}
		rest = append(rest, p)
	}
	return strings.Join(rest, "/"), impl
}

type summary struct {
	center float64
	pct    string // benchstat's ± column
	n      int
}

func summarize(xs []float64) summary {
	if len(xs) == 0 {
		return summary{center: math.NaN()}
	}
	s := benchmath.NewSample(append([]float64(nil), xs...), &benchmath.DefaultThresholds)
	sum := benchmath.AssumeNothing.Summary(s, 0.95)
	return summary{center: sum.Center, pct: sum.PctRangeString(), n: len(xs)}
}

func baseline(g *group) *row {
	for _, b := range baselines {
		if strings.HasPrefix(g.name, b.prefix) {
			if r := g.byImpl[b.impl]; r != nil {
				return r
			}
		}
	}
	return g.rows[0]
}

func render(w io.Writer, groups []*group) {
	for _, g := range groups {
		base := baseline(g)
		hasCPU := false
		for _, r := range g.rows {
			if _, ok := r.values["cpu-ns/op"]; ok {
				hasCPU = true
			}
		}
		fmt.Fprintf(w, "**%s** (ratios against %s)\n\n", g.name, base.impl)
		head := "| impl | ns/op | ± | × base |"
		rule := "|---|---:|---:|---:|"
		if hasCPU {
			head += " cpu-ns/op | ± | × base |"
			rule += "---:|---:|---:|"
		}
		head += " B/op | allocs/op | goroutines/op | note |"
		rule += "---:|---:|---:|---|"
		fmt.Fprintln(w, head)
		fmt.Fprintln(w, rule)
		bt := summarize(base.values["ns/op"])
		bc := summarize(base.values["cpu-ns/op"])
		for _, r := range g.rows {
			t := summarize(r.values["ns/op"])
			line := fmt.Sprintf("| %s | %s | ±%s | %s |", r.impl, num(t.center), t.pct, ratio(t.center, bt.center, r == base))
			if hasCPU {
				c := summarize(r.values["cpu-ns/op"])
				line += fmt.Sprintf(" %s | ±%s | %s |", num(c.center), c.pct, ratio(c.center, bc.center, r == base))
			}
			line += fmt.Sprintf(" %s | %s | %s | %s |",
				count(summarize(r.values["B/op"]).center),
				count(summarize(r.values["allocs/op"]).center),
				frac(summarize(r.values["goroutines/op"]).center),
				note(g.name, r.impl))
			fmt.Fprintln(w, line)
		}
		fmt.Fprintln(w)
	}
}

func num(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v < 10:
		return fmt.Sprintf("%.2f", v)
	case v < 100:
		return fmt.Sprintf("%.1f", v)
	default:
		return thousands(int64(math.Round(v)))
	}
}

func count(v float64) string {
	if math.IsNaN(v) {
		return "-"
	}
	return thousands(int64(math.Round(v)))
}

func frac(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v == 0:
		return "0"
	default:
		return fmt.Sprintf("%.2f", v)
	}
}

func ratio(v, base float64, isBase bool) string {
	switch {
	case isBase:
		return "**1**"
	case math.IsNaN(v) || math.IsNaN(base) || base == 0:
		return "-"
	case v/base < 0.1:
		return fmt.Sprintf("%.3f", v/base)
	default:
		return fmt.Sprintf("%.2f", v/base)
	}
}

func thousands(n int64) string {
	s := fmt.Sprint(n)
	if n < 0 || len(s) <= 3 {
		return s
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

const (
	startMark = "<!-- benchtable:start -->"
	endMark   = "<!-- benchtable:end -->"
)

func replace(path string, table []byte) error {
	old, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	i := bytes.Index(old, []byte(startMark))
	j := bytes.Index(old, []byte(endMark))
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %s ... %s section", path, startMark, endMark)
	}
	var b bytes.Buffer
	b.Write(old[:i+len(startMark)])
	b.WriteString("\n")
	b.Write(table)
	b.Write(old[j:])
	return os.WriteFile(path, b.Bytes(), 0o644)
}
