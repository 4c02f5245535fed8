package config

import (
	"errors"
	"fmt"
	"sort"
	"strings"
)

// The severities of a Diagnostic: an error stops the file from loading, a
// warning does not.
const (
	severityError   = "error"
	severityWarning = "warning"
)

// ErrInvalidConfig is the sentinel the error of Parse, Load and Reload Is
// when the file holds an error, and that of NewAdmin for a configuration
// that would leave the endpoint's writes open.
var ErrInvalidConfig = errors.New("config: invalid config")

// Diagnostic is one finding about a file: where, which setting, what was
// found and what is allowed (an error), or what is risky and why (a
// warning). It is a plain value.
type Diagnostic struct {
	File  string `json:"file"`
	Line  int    `json:"line"`
	Field string `json:"field,omitempty"` // dotted path of the key, e.g. dependencies.payments.attempt_timeout
	// Severity is "error", which stops the file from loading, or
	// "warning", which does not.
	Severity string `json:"severity"`
	Message  string `json:"message"`
}

// String renders the diagnostic as file:line: field: message.
func (d Diagnostic) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s:%d: ", d.File, d.Line)
	if d.Field != "" {
		b.WriteString(d.Field)
		b.WriteString(": ")
	}
	b.WriteString(d.Message)
	return b.String()
}

// Error is the error of a file that does not load: every error
// Diagnostic, in line order. It Is ErrInvalidConfig. It is immutable once
// returned.
type Error struct {
	Diagnostics []Diagnostic
}

// Error lists the diagnostics, one a line.
func (e *Error) Error() string {
	lines := make([]string, len(e.Diagnostics))
	for i, d := range e.Diagnostics {
		lines[i] = d.String()
	}
	return strings.Join(lines, "\n")
}

// Is reports whether target is ErrInvalidConfig.
func (e *Error) Is(target error) bool { return target == ErrInvalidConfig }

func sortDiags(ds []Diagnostic) {
	sort.SliceStable(ds, func(i, j int) bool {
		if ds[i].Line != ds[j].Line {
			return ds[i].Line < ds[j].Line
		}
		return ds[i].Field < ds[j].Field
	})
}

// split sorts ds into errors and warnings, each once: a setting of the
// defaults that every dependency inherits is found once per dependency,
// and said once.
func split(ds []Diagnostic) (errs, warns []Diagnostic) {
	seen := make(map[Diagnostic]bool, len(ds))
	for _, d := range ds {
		if seen[d] {
			continue
		}
		seen[d] = true
		if d.Severity == severityError {
			errs = append(errs, d)
		} else {
			warns = append(warns, d)
		}
	}
	sortDiags(errs)
	sortDiags(warns)
	return errs, warns
}
