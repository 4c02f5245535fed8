package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/guardrail-go/guardrail/extra/config"
)

// writeReport writes the report of guardrail check for a terminal.
func writeReport(w io.Writer, rep *config.Report) error {
	var b strings.Builder
	for _, d := range rep.Dependencies {
		fmt.Fprintf(&b, "%s (%s)\n", d.Name, d.Kind)
		if len(d.Differences) == 0 {
			b.WriteString("  the defaults, unchanged\n")
		} else {
			b.WriteString("  differs from the defaults:\n")
			for _, df := range d.Differences {
				fmt.Fprintf(&b, "    %-28s %s (default %s; line %d)\n", df.Key, df.Value, df.Default, df.Line)
			}
		}
		if d.Reason != "" {
			fmt.Fprintf(&b, "  reason:   %s\n", d.Reason)
		}
		if d.Owner != "" {
			fmt.Fprintf(&b, "  owner:    %s\n", d.Owner)
		}
		if d.Decision != "" {
			fmt.Fprintf(&b, "  decision: %s\n", d.Decision)
		}
		b.WriteString("  effective:\n")
		for _, s := range d.Effective {
			fmt.Fprintf(&b, "    %-28s %s\n", s.Key, s.Value)
		}
	}
	for _, s := range rep.Servers {
		fmt.Fprintf(&b, "server %s\n", s.Name)
		if s.Reason != "" {
			fmt.Fprintf(&b, "  reason:   %s\n", s.Reason)
		}
		for _, e := range s.Effective {
			fmt.Fprintf(&b, "    %-28s %s\n", e.Key, e.Value)
		}
	}
	if len(rep.Errors) > 0 {
		fmt.Fprintf(&b, "%d error(s):\n", len(rep.Errors))
		for _, d := range rep.Errors {
			fmt.Fprintf(&b, "  %s\n", d)
		}
	}
	if len(rep.Warnings) > 0 {
		fmt.Fprintf(&b, "%d warning(s):\n", len(rep.Warnings))
		for _, d := range rep.Warnings {
			fmt.Fprintf(&b, "  %s\n", d)
		}
	} else if len(rep.Errors) == 0 {
		b.WriteString("no warnings\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
