// Command adaptive measures adaptive concurrency limiters side by side on
// one workload: an HTTP server whose capacity is a FIFO pool of slots, each
// query holding its slot 50 ms, the pool changing size mid-run (10, then 5,
// then 20 slots), under open-loop load from a separate process at 3, 10 or
// 30 times the initial capacity. See README.md.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if cfg := os.Getenv(loadgenEnv); cfg != "" {
		loadgenMain(cfg)
		return
	}
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "adaptive:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	Limiters  []limiterSpec
	Overloads []float64
	Runs      int
	W         workload
	Timeout   time.Duration
	JSON      string
	Markdown  string
	Series    string
	Verbose   bool
}

func parseOptions(args []string, stderr io.Writer) (options, error) {
	fs := flag.NewFlagSet("adaptive", flag.ContinueOnError)
	fs.SetOutput(stderr)
	limiters := fs.String("limiters", "guardrail,failsafe,gradient2,vegas,fixed=10,fixed=30,fixed=60",
		"comma-separated limiters: none, fixed=N, guardrail, failsafe, gradient2, vegas")
	overloads := fs.String("overloads", "3", "comma-separated load factors, times the initial capacity (slots/hold per second)")
	runs := fs.Int("runs", 3, "runs of each configuration; the report gives medians")
	phase := fs.Duration("phase", 3*time.Second, "length of each phase, a multiple of 100ms")
	slots := fs.String("slots", "10,5,20", "pool size in each phase")
	hold := fs.Duration("hold", 50*time.Millisecond, "time each query holds its slot")
	timeout := fs.Duration("timeout", time.Second, "client timeout of each request")
	jsonOut := fs.String("json", "", "write the result rows as JSON to this file")
	markdown := fs.String("md", "", "write the results as a Markdown table to this file")
	series := fs.String("series", "", "write every run's limit samples (every 50 ms) as JSON to this file")
	verbose := fs.Bool("v", false, "print each run as it ends")
	if err := fs.Parse(args); err != nil {
		return options{}, err
	}
	var o options
	var err error
	if o.Limiters, err = parseLimiters(*limiters); err != nil {
		return o, err
	}
	for _, f := range strings.Split(*overloads, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v <= 0 {
			return o, fmt.Errorf("-overloads: bad factor %q", f)
		}
		o.Overloads = append(o.Overloads, v)
	}
	for _, f := range strings.Split(*slots, ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v <= 0 {
			return o, fmt.Errorf("-slots: bad size %q", f)
		}
		o.W.Slots = append(o.W.Slots, v)
	}
	if *runs < 1 {
		return o, fmt.Errorf("-runs: want at least 1")
	}
	if *phase < 2*bucket || *phase%bucket != 0 {
		return o, fmt.Errorf("-phase: want a multiple of %v, at least %v", bucket, 2*bucket)
	}
	if *hold <= 0 || *timeout <= 0 {
		return o, fmt.Errorf("-hold and -timeout must be positive")
	}
	o.Runs, o.W.Phase, o.W.Hold, o.Timeout = *runs, *phase, *hold, *timeout
	o.JSON, o.Markdown, o.Series, o.Verbose = *jsonOut, *markdown, *series, *verbose
	return o, nil
}

func run(args []string, stdout io.Writer) error {
	o, err := parseOptions(args, os.Stderr)
	if err != nil {
		return err
	}
	baseRPS := float64(o.W.Slots[0]) / o.W.Hold.Seconds()
	type key struct {
		lim  string
		over float64
	}
	results := map[key][]runResult{}
	var series []seriesRun
	// Rounds outermost, so that a burst of load from elsewhere on the
	// machine hits one run of every configuration rather than all the runs
	// of one.
	for r := range o.Runs {
		for _, over := range o.Overloads {
			for _, ls := range o.Limiters {
				res, err := runOnce(ls, o.W, over*baseRPS, o.Timeout)
				if err != nil {
					return fmt.Errorf("%v at %gx: %w", ls, over, err)
				}
				k := key{ls.String(), over}
				results[k] = append(results[k], res)
				if o.Verbose {
					fmt.Fprintf(os.Stderr, "run %d %v %gx: %s\n", r+1, ls, over, res.summary())
				}
				if o.Series != "" {
					series = append(series, seriesRun{Limiter: ls.String(), Overload: over, Run: r + 1, Samples: res.Samples})
				}
			}
		}
	}
	var rows []row
	for _, over := range o.Overloads {
		for _, ls := range o.Limiters {
			rows = append(rows, aggregate(ls, over, over*baseRPS, results[key{ls.String(), over}])...)
		}
	}
	for i := range rows {
		rows[i].Row = i + 1
	}
	writeTable(stdout, rows, o)
	if o.JSON != "" {
		if err := writeJSON(o.JSON, rows); err != nil {
			return err
		}
	}
	if o.Markdown != "" {
		var b strings.Builder
		writeMarkdown(&b, rows, o)
		if err := os.WriteFile(o.Markdown, []byte(b.String()), 0o644); err != nil {
			return err
		}
	}
	if o.Series != "" {
		if err := writeJSON(o.Series, series); err != nil {
			return err
		}
	}
	return nil
}

// runResult is one run of one configuration.
type runResult struct {
	Phases  []phaseMetrics
	Server  []serverCounts
	Load    loadCheck
	Samples []limitSample
	Records int
	// Dials is how many connections the load generator opened; LoadCPU and
	// ServerCPU the CPU time of its process and of this one (the server)
	// during the run.
	Dials              int64
	LoadCPU, ServerCPU time.Duration
}

func (r runResult) summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "sent %.0f/s (p99 lag %v, judged %v; %d conns, cpu load %.1fs server %.1fs)",
		r.Load.Achieved, r.Load.P99Lag.Round(time.Millisecond), r.Load.Judged, r.Dials, r.LoadCPU.Seconds(), r.ServerCPU.Seconds())
	for _, p := range r.Phases {
		fmt.Fprintf(&b, " | p%d(%d) %.1f%% p99 %s conv %s lim %d",
			p.Phase, p.Slots, p.GoodputPct, fmtMs(p.P99OK), fmtMs(p.Converge), p.LimitMedian)
	}
	return b.String()
}

// startDelay leaves the load generator time to start before time zero.
const startDelay = 500 * time.Millisecond

// runOnce runs one configuration once: a fresh limiter, pool and server,
// and a load generator process sending rps for the whole schedule.
func runOnce(ls limiterSpec, w workload, rps float64, timeout time.Duration) (runResult, error) {
	lim, err := newLimiter(ls)
	if err != nil {
		return runResult{}, err
	}
	start := time.Now().Add(startDelay)
	cpu0 := selfCPU()
	srv, err := startServer(w, lim, start)
	if err != nil {
		return runResult{}, err
	}
	load, loadErr := runLoad(loadConfig{
		URL: srv.url(), RPS: rps, Start: start.UnixNano(), Duration: w.total(), Timeout: timeout,
	})
	counts, samples := srv.close()
	if loadErr != nil {
		return runResult{}, loadErr
	}
	return runResult{
		Phases:    analyze(load.Recs, w, timeout, samples),
		Server:    counts,
		Load:      checkLoad(load.Recs, rps, w.total()),
		Samples:   samples,
		Records:   len(load.Recs),
		Dials:     load.Dials,
		LoadCPU:   load.CPU,
		ServerCPU: selfCPU() - cpu0,
	}, nil
}

// selfCPU is this process's user + system CPU time so far.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

type seriesRun struct {
	Limiter  string        `json:"limiter"`
	Overload float64       `json:"overload"`
	Run      int           `json:"run"`
	Samples  []limitSample `json:"samples"`
}
