package vet

import (
	"context"
	"fmt"
	"go/token"
	"sort"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"
)

// Finding is one diagnostic of a check, with its position resolved.
type Finding struct {
	// Check is the analyzer's name.
	Check string
	// Pos is where the finding is.
	Pos token.Position
	// Message starts with "[check] ".
	Message string
}

// String formats f as file:line:col: message.
func (f Finding) String() string {
	return fmt.Sprintf("%s:%d:%d: %s", f.Pos.Filename, f.Pos.Line, f.Pos.Column, f.Message)
}

// CheckConfig says what Check loads.
type CheckConfig struct {
	// Dir is the directory the patterns are relative to; empty means the
	// current one.
	Dir string
	// Env is the go command's environment; nil means this process's.
	Env []string
	// Analyzers are the checks to run; nil means Analyzers().
	Analyzers []*analysis.Analyzer
}

// Check loads the packages patterns match, with the go command, and runs
// the analyzers on them. It returns the findings sorted by position and
// without duplicates (a package and its test variant share files), and the
// errors of packages that could not be loaded or analyzed, which are
// skipped. err is for a failure to load anything at all.
func Check(ctx context.Context, cfg CheckConfig, patterns ...string) (findings []Finding, pkgErrs []error, err error) {
	as := cfg.Analyzers
	if as == nil {
		as = Analyzers()
	}
	pcfg := &packages.Config{
		Context: ctx,
		Dir:     cfg.Dir,
		Env:     cfg.Env,
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
	graph, err := checker.Analyze(as, pkgs, nil)
	if err != nil {
		return nil, pkgErrs, fmt.Errorf("vet: %w", err)
	}
	seen := map[Finding]bool{}
	for act := range graph.All() {
		if !act.IsRoot {
			continue
		}
		if act.Err != nil {
			addErr(fmt.Errorf("%s: %w", act.Package.PkgPath, act.Err))
			continue
		}
		for _, d := range act.Diagnostics {
			f := Finding{Check: act.Analyzer.Name, Pos: act.Package.Fset.Position(d.Pos), Message: d.Message}
			if !seen[f] {
				seen[f] = true
				findings = append(findings, f)
			}
		}
	}
	sort.Slice(findings, func(i, j int) bool {
		a, b := findings[i], findings[j]
		if a.Pos.Filename != b.Pos.Filename {
			return a.Pos.Filename < b.Pos.Filename
		}
		if a.Pos.Line != b.Pos.Line {
			return a.Pos.Line < b.Pos.Line
		}
		if a.Pos.Column != b.Pos.Column {
			return a.Pos.Column < b.Pos.Column
		}
		return a.Message < b.Message
	})
	return findings, pkgErrs, nil
}
