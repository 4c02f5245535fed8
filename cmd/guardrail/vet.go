package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/guardrail-go/guardrail/vet"
	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"
)

func init() {
	register(command{
		name:    "vet",
		summary: "check Go code against the production checklist (timeouts, deadlines, retries)",
		run:     runVet,
	})
}

const vetUsage = `usage: guardrail vet [flags] [packages]

Checks Go packages (default ./...) against the production checklist for
code that calls other services, and prints each finding as

	file:line:col: [check] message

The checks:
  timeout      an outbound call nothing bounds: http.Get and friends,
               http.DefaultClient, an http.Client without Timeout or a
               Transport with timeouts, net.Dial without a timeout,
               http.NewRequest where a context is at hand
  deadline     context.Background() or TODO() used for an outbound call
               where the caller's ctx or *http.Request is at hand
  retryloop    a hand-written retry loop without jitter, without a bound,
               retrying every error, or sleeping without watching ctx
  stacked      retries on retries: a retrying guardrail.Do around a client
               that retries itself, or around another guardrail.Do
  idempotency  a POST or PATCH sent through a retrying guardrail client
               without an Idempotency-Key

Test files are not checked. Silence a finding with a comment on its line
or the line above, giving the reason (one without is itself reported):

	//guardrail:ignore timeout the probe must wait as long as the kernel does

Exits 1 when there are findings, 2 on a bad command line.

Flags:
`

func runVet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("vet", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		io.WriteString(fs.Output(), vetUsage)
		fs.PrintDefaults()
	}
	checks := fs.String("checks", "", "comma-separated checks to run (default: all)")
	dir := fs.String("C", "", "run as if in this directory")
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return usageError{err.Error()}
	}
	var names []string
	if *checks != "" {
		for _, n := range strings.Split(*checks, ",") {
			if n = strings.TrimSpace(n); n != "" {
				names = append(names, n)
			}
		}
	}
	analyzers, err := vet.ByName(names)
	if err != nil {
		return usageError{err.Error()}
	}
	patterns := fs.Args()
	if len(patterns) == 0 {
		patterns = []string{"./..."}
	}
	n, err := vetPackages(ctx, *dir, patterns, analyzers, stdout, stderr)
	if err != nil {
		return err
	}
	if n > 0 {
		return fmt.Errorf("%d finding(s)", n)
	}
	return nil
}

// vetPackages loads the packages patterns match and runs analyzers on them,
// printing findings to stdout sorted by position. It returns their number.
func vetPackages(ctx context.Context, dir string, patterns []string, analyzers []*analysis.Analyzer, stdout, stderr io.Writer) (int, error) {
	cfg := &packages.Config{
		Context: ctx,
		Dir:     dir,
		Mode:    packages.LoadSyntax | packages.NeedModule,
	}
	pkgs, err := packages.Load(cfg, patterns...)
	if err != nil {
		return 0, fmt.Errorf("loading packages: %w", err)
	}
	if len(pkgs) == 0 {
		return 0, fmt.Errorf("no packages match %s", strings.Join(patterns, " "))
	}
	broken := 0
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		for _, e := range p.Errors {
			fmt.Fprintln(stderr, e)
			broken++
		}
	})
	graph, err := checker.Analyze(analyzers, pkgs, nil)
	if err != nil {
		return 0, err
	}
	type finding struct {
		file      string
		line, col int
		msg       string
	}
	var out []finding
	seen := map[finding]bool{}
	failed := map[string]bool{}
	wd, _ := os.Getwd()
	if dir != "" {
		wd, _ = filepath.Abs(dir)
	}
	for act := range graph.All() {
		if !act.IsRoot {
			continue
		}
		if act.Err != nil {
			msg := fmt.Sprintf("%s: %v", act.Package.PkgPath, act.Err)
			if !failed[msg] {
				failed[msg] = true
				fmt.Fprintln(stderr, msg)
			}
			continue
		}
		for _, d := range act.Diagnostics {
			p := act.Package.Fset.Position(d.Pos)
			file := p.Filename
			if rel, err := filepath.Rel(wd, file); err == nil && !strings.HasPrefix(rel, "..") {
				file = rel
			}
			f := finding{file, p.Line, p.Column, d.Message}
			if !seen[f] {
				seen[f] = true
				out = append(out, f)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.file != b.file {
			return a.file < b.file
		}
		if a.line != b.line {
			return a.line < b.line
		}
		if a.col != b.col {
			return a.col < b.col
		}
		return a.msg < b.msg
	})
	for _, f := range out {
		fmt.Fprintf(stdout, "%s:%d:%d: %s\n", f.file, f.line, f.col, f.msg)
	}
	if broken > 0 && len(out) == 0 {
		return 0, fmt.Errorf("%d package error(s)", broken)
	}
	return len(out), nil
}
