// Package vet holds static analyzers for the production checklist of code
// that calls other services: every remote call is bounded by a timeout and
// sits inside the caller's deadline; retries are explicit, classified,
// jittered, bounded and happen at one tier only; a request retried by a
// guardrail client is safe to repeat.
//
// Each check is an *analysis.Analyzer of its own, so it runs under any
// driver of golang.org/x/tools/go/analysis: the guardrail command's vet
// subcommand, go vet -vettool with the guardrail-vet binary, or
// golangci-lint as a module plugin (package golangci).
//
// The analyzers aim for precision over recall: they report a pattern only
// when the code they can see shows the problem, and stay silent when a
// value comes from somewhere they cannot follow (a parameter, another
// package). They skip _test.go files, whose calls go to test servers.
//
// A finding is silenced by a comment on its line or on the line above:
//
//	//guardrail:ignore timeout the probe must wait for as long as the kernel does
//
// The check's name (or several, separated by commas) comes first, then the
// reason, which is required: a suppression without one is itself reported
// and silences nothing, because an unexplained exception is how a checklist
// stops being read.
//
// The analyzers keep no state between runs and are safe for concurrent use
// by a driver.
package vet

import "golang.org/x/tools/go/analysis"

// Analyzers returns every check of the checklist, in a fixed order:
// Timeout, Deadline, RetryLoop, Stacked, Idempotency, Tiers.
func Analyzers() []*analysis.Analyzer {
	return []*analysis.Analyzer{Timeout, Deadline, RetryLoop, Stacked, Idempotency, Tiers}
}

// ByName returns the analyzers named in names, in the order of Analyzers,
// or an error naming the first unknown one. An empty names means all.
func ByName(names []string) ([]*analysis.Analyzer, error) {
	all := Analyzers()
	if len(names) == 0 {
		return all, nil
	}
	want := map[string]bool{}
	for _, n := range names {
		found := false
		for _, a := range all {
			if a.Name == n {
				found = true
			}
		}
		if !found {
			return nil, &unknownCheckError{name: n}
		}
		want[n] = true
	}
	var out []*analysis.Analyzer
	for _, a := range all {
		if want[a.Name] {
			out = append(out, a)
		}
	}
	return out, nil
}

// unknownCheckError reports a check name that is not one of Analyzers.
type unknownCheckError struct {
	name string // the name asked for
}

func (e *unknownCheckError) Error() string {
	return "vet: unknown check " + `"` + e.name + `"` + "; want timeout, deadline, retryloop, stacked, idempotency or tiers"
}
