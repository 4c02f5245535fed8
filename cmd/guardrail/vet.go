package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/guardrail-go/guardrail/extra/vet"
	"golang.org/x/tools/go/analysis"
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
	findings, pkgErrs, err := vet.Check(ctx, vet.CheckConfig{Dir: dir, Analyzers: analyzers}, patterns...)
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
		if rel, err := filepath.Rel(wd, f.Pos.Filename); err == nil && !strings.HasPrefix(rel, "..") {
			f.Pos.Filename = rel
		}
		fmt.Fprintln(stdout, f)
	}
	if len(pkgErrs) > 0 && len(findings) == 0 {
		return 0, fmt.Errorf("%d package error(s)", len(pkgErrs))
	}
	return len(findings), nil
}
