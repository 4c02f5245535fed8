package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail/cmd/guardrail/internal/lab"
)

func init() {
	register(command{name: "lab", summary: "run the experiments on loopback HTTP servers, print their numbers and check them", run: runLab})
}

// experiments lists the lab's experiments; tests replace it.
var experiments = lab.Experiments

const labUsage = `usage: guardrail lab [flags] [NAME [NAME flags]]...

Runs every experiment, or the ones named, each on real HTTP servers on
127.0.0.1 (jitter is a simulation), prints its table and checks its own
numbers. A check passes, fails, or is not judged when the run could not
measure what it needs (a machine too busy to keep a load on schedule); only
a failed check makes the lab exit 1. The lab's flags below may come before
or after the names; an experiment's own flags follow its name.
'guardrail lab NAME --help' lists an experiment's flags.

Experiments:
`

// labFlags are the flags of the lab itself, accepted anywhere on its
// command line.
type labFlags struct {
	quick  bool
	json   bool
	report string
	seed   uint64
	fs     *flag.FlagSet
}

func newLabFlags() *labFlags {
	f := &labFlags{fs: newFlagSet("lab")}
	f.fs.BoolVar(&f.quick, "quick", false, "shrink durations and counts (CI smoke test)")
	f.fs.BoolVar(&f.json, "json", false, "write JSON lines to stdout instead of tables: one object per row, then one per check")
	f.fs.StringVar(&f.report, "report", "", "write a self-contained HTML report with charts to this file")
	f.fs.Uint64Var(&f.seed, "seed", 1, "seed for every random draw")
	return f
}

func labHelp(fs *flag.FlagSet) func(io.Writer) {
	return func(w io.Writer) {
		io.WriteString(w, labUsage)
		for _, e := range experiments() {
			fmt.Fprintf(w, "  %-14s %s\n", e.Name, e.Summary)
		}
		fmt.Fprintln(w, "\nFlags:")
		printFlags(w, fs)
		fmt.Fprintln(w)
		fmt.Fprint(w, exitCodes)
	}
}

func experimentHelp(e lab.Experiment, quick bool) func(io.Writer) {
	return func(w io.Writer) {
		fmt.Fprintf(w, "usage: guardrail lab %s [flags]\n\n%s\n\nFlags:\n", e.Name, e.Summary)
		own := newFlagSet(e.Name)
		e.Setup(own, quick)
		printFlags(w, own)
		fmt.Fprintln(w, "\nThe lab's flags (--quick, --json, --report, --seed) are accepted too;")
		fmt.Fprintln(w, "'guardrail lab --help' describes them.")
		fmt.Fprintln(w)
		fmt.Fprint(w, exitCodes)
	}
}

// selected is an experiment named on the command line, with its flags.
type selected struct {
	exp   lab.Experiment
	run   lab.Run
	fs    *flag.FlagSet
	flags []string
}

// parseLab splits the lab's command line into its experiments, each with
// the flags that follow its name, and parses them. The experiments' defaults
// depend on --quick, wherever it stands, so the caller parses twice: first
// to learn --quick, then with the defaults it chooses. When -h or --help was
// given, help is what it asked about: an experiment after its name, the lab
// itself (a selected with no run) before any name.
func parseLab(args []string, quick bool) (*labFlags, []selected, *selected, error) {
	lf := newLabFlags()
	var sel []selected
	var lead []string           // the flags before the first name
	flags := func() *[]string { // those of the last name, or lead
		if len(sel) == 0 {
			return &lead
		}
		return &sel[len(sel)-1].flags
	}
	fs := lf.fs
	byName := map[string]lab.Experiment{}
	for _, e := range experiments() {
		byName[e.Name] = e
	}
	onlyNames := false // after "--"
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" && !onlyNames {
			onlyNames = true
			continue
		}
		if onlyNames || len(a) < 2 || a[0] != '-' {
			e, ok := byName[a]
			if !ok {
				return nil, nil, nil, usageError{fmt.Sprintf("unknown experiment %q (have %s)", a, strings.Join(names(), ", "))}
			}
			efs := newFlagSet("lab " + a)
			run := e.Setup(efs, quick)
			// The lab's flags work after a name too; an experiment's own
			// flag of the same name (jitter's --seed) wins there.
			lf.fs.VisitAll(func(f *flag.Flag) {
				if efs.Lookup(f.Name) == nil {
					efs.Var(f.Value, f.Name, f.Usage)
				}
			})
			sel = append(sel, selected{exp: e, run: run, fs: efs})
			fs = efs
			continue
		}
		if name, ok := unknownFlag(fs, a); ok {
			// Stop here: the flag's value, if it has one, would pass for
			// an experiment's name.
			err := fmt.Errorf("flag provided but not defined: -%s", name)
			if len(sel) == 0 {
				return nil, nil, nil, usageError{err.Error() + experimentFlagHint(name)}
			}
			s := sel[len(sel)-1]
			return nil, nil, nil, helpHint{usageError{s.exp.Name + ": " + err.Error()}, "guardrail lab " + s.exp.Name + " --help"}
		}
		f := flags()
		*f = append(*f, a)
		if takesValue(fs, a) && i+1 < len(args) {
			i++
			*f = append(*f, args[i])
		}
	}
	var help *selected
	if err := lf.fs.Parse(lead); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return lf, sel, &selected{}, nil
		}
		return nil, nil, nil, usageError{err.Error()}
	}
	for i := range sel {
		s := &sel[i]
		if err := s.fs.Parse(s.flags); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				if help == nil {
					help = s
				}
				continue
			}
			return nil, nil, nil, helpHint{usageError{s.exp.Name + ": " + err.Error()}, "guardrail lab " + s.exp.Name + " --help"}
		}
	}
	if len(sel) == 0 {
		for _, e := range experiments() {
			fs := newFlagSet(e.Name)
			sel = append(sel, selected{exp: e, run: e.Setup(fs, quick), fs: fs})
		}
	}
	return lf, sel, help, nil
}

// experimentFlagHint says which experiments define a flag the lab does not.
func experimentFlagHint(name string) string {
	var owners []string
	for _, e := range experiments() {
		fs := newFlagSet(e.Name)
		e.Setup(fs, false)
		if fs.Lookup(name) != nil {
			owners = append(owners, e.Name)
		}
	}
	if len(owners) == 0 {
		return ""
	}
	return fmt.Sprintf(" (--%s is a flag of %s: put it after the experiment's name)", name, strings.Join(owners, ", "))
}

func names() []string {
	var out []string
	for _, e := range experiments() {
		out = append(out, e.Name)
	}
	sort.Strings(out)
	return out
}

func runLab(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	lf, runs, help, err := parseLab(args, false)
	if err != nil {
		return err
	}
	if lf.quick {
		if lf, runs, help, err = parseLab(args, true); err != nil {
			return err
		}
	}
	switch {
	case help != nil && help.run == nil:
		labHelp(lf.fs)(stdout)
		return flag.ErrHelp
	case help != nil:
		experimentHelp(help.exp, lf.quick)(stdout)
		return flag.ErrHelp
	}

	// Every selected experiment's flags are checked before the first runs:
	// a bad value of the last one must not wait for the others to finish.
	for _, s := range runs {
		if fe, ok := errors.AsType[*lab.FlagError](lab.CheckFlags(s.run)); ok {
			return helpHint{usageError{s.exp.Name + ": " + fe.Msg}, "guardrail lab " + s.exp.Name + " --help"}
		}
	}
	prog := newProgress(stderr)
	defer prog.stop()
	var results []*lab.Result
	var failed, unjudged []string
	start := time.Now()
	// Consecutive light experiments run at once; every other one runs
	// alone. Their tables are printed in the order of the list.
	for i := 0; i < len(runs); {
		j := i + 1
		for runs[i].exp.Light && j < len(runs) && runs[j].exp.Light {
			j++
		}
		batch := runs[i:j]
		i = j
		names := make([]string, len(batch))
		for k, s := range batch {
			names[k] = s.exp.Name
		}
		prog.set(strings.Join(names, ", "))
		out := make([]*lab.Result, len(batch))
		errs := make([]error, len(batch))
		var wg sync.WaitGroup
		for k, s := range batch {
			wg.Go(func() {
				env := &lab.Env{Quick: lf.quick, Seed: lf.seed, Progress: prog.printf}
				t0 := time.Now()
				out[k], errs[k] = s.run(ctx, env)
				if out[k] != nil {
					out[k].Took = time.Since(t0)
				}
			})
		}
		wg.Wait()
		prog.clear()
		for k, s := range batch {
			res, err := out[k], errs[k]
			if fe, ok := errors.AsType[*lab.FlagError](err); ok {
				return helpHint{usageError{s.exp.Name + ": " + fe.Msg}, "guardrail lab " + s.exp.Name + " --help"}
			}
			if err != nil {
				return fmt.Errorf("%s: %w", s.exp.Name, err)
			}
			results = append(results, res)
			if lf.json {
				if err := lab.WriteJSON(stdout, res); err != nil {
					return err
				}
			} else {
				lab.WriteTable(stdout, res)
			}
			for _, c := range res.Failed() {
				failed = append(failed, fmt.Sprintf("%s: %s: %s", res.Experiment, c.Name, c.Detail))
			}
			for _, c := range res.NotJudged() {
				unjudged = append(unjudged, fmt.Sprintf("%s: %s", res.Experiment, c.Name))
			}
		}
	}
	if lf.report != "" {
		f, err := os.Create(lf.report)
		if err != nil {
			return err
		}
		werr := lab.WriteReport(f, results, time.Since(start))
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return werr
		}
		fmt.Fprintf(stderr, "report written to %s\n", lf.report)
	}
	checks := 0
	for _, res := range results {
		checks += len(res.Checks)
	}
	fmt.Fprintf(stderr, "guardrail lab: %d experiment(s) in %v, %d check(s): %d pass, %d fail, %d not judged\n",
		len(results), time.Since(start).Round(100*time.Millisecond), checks, checks-len(failed)-len(unjudged), len(failed), len(unjudged))
	if len(unjudged) > 0 {
		fmt.Fprintf(stderr, "guardrail lab: %d check(s) not judged, the run could not measure what they need (they do not change the exit status):\n  %s\n",
			len(unjudged), strings.Join(unjudged, "\n  "))
	}
	if len(failed) > 0 {
		return fmt.Errorf("%d check(s) failed:\n  %s", len(failed), strings.Join(failed, "\n  "))
	}
	return nil
}

// progress shows the running experiment and its elapsed time on one
// rewritten stderr line, only when stderr is a terminal.
type progress struct {
	w      io.Writer
	tty    bool
	mu     sync.Mutex
	name   string
	msg    string
	start  time.Time
	done   chan struct{}
	ticker *time.Ticker
	wg     sync.WaitGroup
}

func newProgress(w io.Writer) *progress {
	p := &progress{w: w, done: make(chan struct{})}
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	if p.tty {
		p.ticker = time.NewTicker(250 * time.Millisecond)
		p.wg.Go(func() {
			for {
				select {
				case <-p.ticker.C:
					p.draw()
				case <-p.done:
					return
				}
			}
		})
	}
	return p
}

func (p *progress) set(name string) {
	p.mu.Lock()
	p.name, p.msg, p.start = name, "", time.Now()
	p.mu.Unlock()
	p.draw()
}

func (p *progress) printf(format string, args ...any) {
	p.mu.Lock()
	p.msg = fmt.Sprintf(format, args...)
	p.mu.Unlock()
	p.draw()
}

func (p *progress) draw() {
	if !p.tty {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.name == "" {
		return
	}
	line := fmt.Sprintf("lab %s %5.1fs  %s", p.name, time.Since(p.start).Seconds(), p.msg)
	if len(line) > 100 {
		line = line[:100]
	}
	fmt.Fprintf(p.w, "\r\033[K%s", line)
}

func (p *progress) clear() {
	p.mu.Lock()
	p.name = ""
	p.mu.Unlock()
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
}

func (p *progress) stop() {
	if p.tty {
		p.ticker.Stop()
		close(p.done)
		p.wg.Wait()
	}
}
