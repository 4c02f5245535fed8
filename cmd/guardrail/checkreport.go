package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/guardrail-go/guardrail/extra/config"
)

// writeReport writes the report of guardrail check for a terminal. Every
// text that comes from the file (names, reasons, values, diagnostics) goes
// through safe, so that a file cannot move the cursor, rewrite a line or
// reorder it on the reader's terminal.
func writeReport(w io.Writer, rep *config.Report) error {
	var b strings.Builder
	q := safe
	for _, d := range rep.Dependencies {
		fmt.Fprintf(&b, "%s (%s)\n", q(d.Name), q(d.Kind))
		if len(d.Differences) == 0 {
			b.WriteString("  the defaults, unchanged\n")
		} else {
			b.WriteString("  differs from the defaults:\n")
			for _, df := range d.Differences {
				fmt.Fprintf(&b, "    %-28s %s (default %s; line %d)\n", q(df.Key), q(df.Value), q(df.Default), df.Line)
			}
		}
		if d.Reason != "" {
			fmt.Fprintf(&b, "  reason:   %s\n", q(d.Reason))
		}
		if d.Owner != "" {
			fmt.Fprintf(&b, "  owner:    %s\n", q(d.Owner))
		}
		if d.Decision != "" {
			fmt.Fprintf(&b, "  decision: %s\n", q(d.Decision))
		}
		b.WriteString("  effective:\n")
		for _, s := range d.Effective {
			fmt.Fprintf(&b, "    %-28s %s\n", q(s.Key), q(s.Value))
		}
	}
	for _, s := range rep.Servers {
		fmt.Fprintf(&b, "server %s\n", q(s.Name))
		if s.Reason != "" {
			fmt.Fprintf(&b, "  reason:   %s\n", q(s.Reason))
		}
		for _, e := range s.Effective {
			fmt.Fprintf(&b, "    %-28s %s\n", q(e.Key), q(e.Value))
		}
	}
	if len(rep.Errors) > 0 {
		fmt.Fprintf(&b, "%d error(s):\n", len(rep.Errors))
		for _, d := range rep.Errors {
			fmt.Fprintf(&b, "  %s\n", safeDiagnostic(d))
		}
	}
	if len(rep.Warnings) > 0 {
		fmt.Fprintf(&b, "%d warning(s):\n", len(rep.Warnings))
		for _, d := range rep.Warnings {
			fmt.Fprintf(&b, "  %s\n", safeDiagnostic(d))
		}
	} else if len(rep.Errors) == 0 {
		b.WriteString("no warnings\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// safeDiagnostic renders d as Diagnostic.String does, each part through
// safe.
func safeDiagnostic(d config.Diagnostic) string {
	d.File, d.Field, d.Message = safe(d.File), safe(d.Field), safe(d.Message)
	return d.String()
}

// safe returns s as it is when every rune of it prints as itself, and
// otherwise s quoted with strconv.Quote, which escapes control characters
// (ESC, CR, BEL, NUL, ...), format characters such as the bidi overrides
// (U+202E), line separators and invalid UTF-8. Ordinary names, accented
// letters and other scripts included, print unchanged; the quotes mark a
// text that was escaped.
func safe(s string) string {
	if !utf8.ValidString(s) {
		return strconv.Quote(s)
	}
	for _, r := range s {
		if !strconv.IsPrint(r) {
			return strconv.Quote(s)
		}
	}
	return s
}

// jsonSafe returns the JSON text js with every rune that does not print as
// itself written as a \u escape, which decodes to the same string:
// encoding/json escapes the ASCII control characters but leaves DEL, the
// C1 controls and the bidi overrides raw, and --json output ends up in CI
// logs that terminals render.
func jsonSafe(js []byte) []byte {
	var out []byte
	for i := 0; i < len(js); {
		r, n := utf8.DecodeRune(js[i:])
		if r == '\n' || strconv.IsPrint(r) || (r == utf8.RuneError && n == 1) {
			// Invalid UTF-8 never comes out of encoding/json.
			if out != nil {
				out = append(out, js[i:i+n]...)
			}
			i += n
			continue
		}
		if out == nil {
			out = append(make([]byte, 0, len(js)+16), js[:i]...)
		}
		if r > 0xffff {
			r1, r2 := utf16.EncodeRune(r)
			out = fmt.Appendf(out, "\\u%04x\\u%04x", r1, r2)
		} else {
			out = fmt.Appendf(out, "\\u%04x", r)
		}
		i += n
	}
	if out == nil {
		return js
	}
	return out
}
