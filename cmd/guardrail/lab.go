package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/guardrail-go/guardrail/cmd/guardrail/internal/lab"
)

func init() {
	register(command{name: "lab", summary: "replay the incidents of the source articles on loopback and print the numbers", run: runLab})
}

const labUsage = `usage: guardrail lab [--quick] [--json] [--report FILE.html] [--seed N] [NAME [flags]]...

Runs every experiment, or the ones named, each on real HTTP servers on
127.0.0.1 (jitter is a simulation), prints its table and checks its own
numbers: the lab exits 1 when a result contradicts what the guardrail
should do. 'guardrail lab NAME --help' lists an experiment's flags.

Experiments:
`

func runLab(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("lab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	quick := fs.Bool("quick", false, "shrink durations and counts (CI smoke test)")
	jsonOut := fs.Bool("json", false, "write one JSON object per row to stdout instead of tables")
	report := fs.String("report", "", "write a self-contained HTML report with charts to this file")
	seed := fs.Uint64("seed", 1, "seed for every random draw")
	fs.Usage = func() {
		fmt.Fprint(stderr, labUsage)
		for _, e := range lab.Experiments() {
			fmt.Fprintf(stderr, "  %-14s %s\n", e.Name, e.Summary)
		}
		fmt.Fprintln(stderr, "\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err.Error()}
	}

	type selected struct {
		exp lab.Experiment
		run lab.Run
	}
	var runs []selected
	rest := fs.Args()
	if len(rest) == 0 {
		for _, e := range lab.Experiments() {
			efs := flag.NewFlagSet(e.Name, flag.ContinueOnError)
			runs = append(runs, selected{e, e.Setup(efs, *quick)})
		}
	}
	for len(rest) > 0 {
		name := rest[0]
		e, ok := lab.Lookup(name)
		if !ok {
			return usageError{fmt.Sprintf("unknown experiment %q (have %s)", name, strings.Join(lab.Names(), ", "))}
		}
		efs := flag.NewFlagSet("lab "+name, flag.ContinueOnError)
		efs.SetOutput(stderr)
		run := e.Setup(efs, *quick)
		efs.Usage = func() {
			fmt.Fprintf(stderr, "usage: guardrail lab %s [flags]\n\n%s\n\nFlags:\n", name, e.Summary)
			efs.PrintDefaults()
		}
		if err := efs.Parse(rest[1:]); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return err
			}
			return usageError{err.Error()}
		}
		runs = append(runs, selected{e, run})
		rest = efs.Args()
	}

	prog := newProgress(stderr)
	defer prog.stop()
	var results []*lab.Result
	var failed []string
	start := time.Now()
	for _, s := range runs {
		prog.set(s.exp.Name)
		env := &lab.Env{Quick: *quick, Seed: *seed, Progress: prog.printf}
		t0 := time.Now()
		res, err := s.run(ctx, env)
		if err != nil {
			prog.clear()
			return fmt.Errorf("%s: %w", s.exp.Name, err)
		}
		res.Took = time.Since(t0)
		prog.clear()
		results = append(results, res)
		if *jsonOut {
			if err := lab.WriteJSON(stdout, res); err != nil {
				return err
			}
		} else {
			lab.WriteTable(stdout, res)
		}
		for _, c := range res.Failed() {
			failed = append(failed, fmt.Sprintf("%s: %s: %s", res.Experiment, c.Name, c.Detail))
		}
	}
	if *report != "" {
		f, err := os.Create(*report)
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
		fmt.Fprintf(stderr, "report written to %s\n", *report)
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
