package main

import (
	"context"
	"fmt"
	"go/token"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"github.com/guardrail-go/guardrail/extra/vet"
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
  tiers        a lower tier with a longer timeout than its caller
               (context.WithTimeout, Policy.AttemptTimeout, client Timeout)

Test files are not checked. Silence a finding with a comment on its line
or the line above, giving the reason (one without is itself reported):

	//guardrail:ignore timeout the probe must wait as long as the kernel does

A finding is a failure: the command exits 1 when there is one.

Flags:
`

func runVet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("vet")
	checks := fs.String("checks", "", "comma-separated checks to run (default: all)")
	dir := fs.String("C", "", "run as if in this directory")
	patterns, err := parseArgs(fs, args, stdout, flagHelp(vetUsage, fs))
	if err != nil {
		return err
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
		return usageError{"--checks: " + strings.TrimPrefix(err.Error(), "vet: ")}
	}
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
// printing findings to stdout (paths relative to the directory) and package
// errors to stderr. It returns the number of findings.
func vetPackages(ctx context.Context, dir string, patterns []string, analyzers []*analysis.Analyzer, stdout, stderr io.Writer) (int, error) {
	findings, pkgErrs, err := vetCheck(ctx, dir, nil, analyzers, patterns...)
	if err != nil {
		return 0, err
	}
	for _, e := range pkgErrs {
		fmt.Fprintln(stderr, e)
	}
	wd, _ := os.Getwd()
	if dir != "" {
		wd, _ = filepath.Abs(dir)
	}
	for _, f := range findings {
		if rel, err := filepath.Rel(wd, f.pos.Filename); err == nil && !strings.HasPrefix(rel, "..") {
			f.pos.Filename = rel
		}
		fmt.Fprintln(stdout, f)
	}
	if len(pkgErrs) > 0 && len(findings) == 0 {
		return 0, fmt.Errorf("%d package error(s)", len(pkgErrs))
	}
	return len(findings), nil
}

// finding is one diagnostic of a check, with its position resolved.
type finding struct {
	check   string         // the analyzer's name
	pos     token.Position // where the finding is
	message string         // starts with "[check] "
}

// String formats f as file:line:col: message.
func (f finding) String() string {
	return fmt.Sprintf("%s:%d:%d: %s", f.pos.Filename, f.pos.Line, f.pos.Column, f.message)
}

// vetCheck loads the packages patterns match, with the go command run in dir
// (empty: the current directory) with env (nil: this process's), and runs
// the analyzers on them. It returns the findings sorted by position and
// without duplicates (a package and its test variant share files), and the
// errors of packages that could not be loaded or analyzed, which are
// skipped. err is for a failure to load anything at all.
func vetCheck(ctx context.Context, dir string, env []string, analyzers []*analysis.Analyzer, patterns ...string) (findings []finding, pkgErrs []error, err error) {
	pcfg := &packages.Config{
		Context: ctx,
		Dir:     dir,
		Env:     env,
		Mode:    packages.LoadSyntax | packages.NeedModule,
	}
	pkgs, err := packages.Load(pcfg, patterns...)
	if err != nil {
		return nil, nil, fmt.Errorf("vet: loading packages: %w", err)
	}
	if len(pkgs) == 0 {
		return nil, nil, fmt.Errorf("vet: no packages match %s", strings.Join(patterns, " "))
	}
	seenErr := map[string]bool{}
	addErr := func(e error) {
		if !seenErr[e.Error()] {
			seenErr[e.Error()] = true
			pkgErrs = append(pkgErrs, e)
		}
	}
	packages.Visit(pkgs, nil, func(p *packages.Package) {
		for _, e := range p.Errors {
			addErr(e)
		}
	})
	graph, err := checker.Analyze(analyzers, pkgs, nil)
	if err != nil {
		return nil, pkgErrs, fmt.Errorf("vet: %w", err)
	}
	seen := map[finding]bool{}
	for act := range graph.All() {
		if !act.IsRoot {
			continue
		}
		if act.Err != nil {
			addErr(fmt.Errorf("%s: %w", act.Package.PkgPath, act.Err))
			continue
		}
		for _, d := range act.Diagnostics {
			f := finding{check: act.Analyzer.Name, pos: act.Package.Fset.Position(d.Pos), message: d.Message}
			if !seen[f] {
				seen[f] = true
				findings = append(findings, f)
			}
		}
	}
	sort.Slice(findings, func(i, j int) bool {
		a, b := findings[i], findings[j]
		if a.pos.Filename != b.pos.Filename {
			return a.pos.Filename < b.pos.Filename
		}
		if a.pos.Line != b.pos.Line {
			return a.pos.Line < b.pos.Line
		}
		if a.pos.Column != b.pos.Column {
			return a.pos.Column < b.pos.Column
		}
		return a.message < b.message
	})
	return findings, pkgErrs, nil
}
