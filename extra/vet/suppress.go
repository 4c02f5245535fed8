package vet

import (
	"bytes"
	"go/ast"
	"go/token"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/tools/go/analysis"
)

// directive is the prefix of a suppression comment.
const directive = "//guardrail:ignore"

type suppression struct {
	checks []string
	reason string
	pos    token.Pos
}

// reporter reports the findings of one analyzer on one package, dropping
// those a suppression comment with a reason covers.
type reporter struct {
	pass *analysis.Pass
	// byLine maps file name and line to the suppressions written there.
	byLine map[string]map[int][]suppression
	src    map[string][]byte
}

// newReporter indexes the suppression comments of the pass's files and
// reports those that name this analyzer but give no reason.
func newReporter(pass *analysis.Pass) *reporter {
	r := &reporter{pass: pass, byLine: map[string]map[int][]suppression{}, src: map[string][]byte{}}
	name := pass.Analyzer.Name
	for _, f := range pass.Files {
		for _, cg := range f.Comments {
			for _, c := range cg.List {
				s, ok := parseDirective(c)
				if !ok || !s.names(name) {
					continue
				}
				if s.reason == "" {
					pass.Report(analysis.Diagnostic{
						Pos:     c.Pos(),
						Message: "[" + name + "] suppression without a reason: write //guardrail:ignore " + name + " <why this is safe>",
					})
					continue
				}
				p := pass.Fset.Position(c.Pos())
				m := r.byLine[p.Filename]
				if m == nil {
					m = map[int][]suppression{}
					r.byLine[p.Filename] = m
				}
				m[p.Line] = append(m[p.Line], s)
				// A comment alone on its line covers the next one too.
				if r.standalone(p) {
					m[p.Line+1] = append(m[p.Line+1], s)
				}
			}
		}
	}
	return r
}

func parseDirective(c *ast.Comment) (suppression, bool) {
	text, ok := strings.CutPrefix(c.Text, directive)
	if !ok || (text != "" && text[0] != ' ' && text[0] != '\t') {
		return suppression{}, false
	}
	fields := strings.Fields(text)
	if len(fields) == 0 {
		return suppression{pos: c.Pos()}, true
	}
	return suppression{
		checks: strings.Split(fields[0], ","),
		reason: strings.Join(fields[1:], " "),
		pos:    c.Pos(),
	}, true
}

func (s suppression) names(check string) bool {
	for _, c := range s.checks {
		if c == check {
			return true
		}
	}
	return false
}

// standalone reports whether only blanks precede the comment at p on its
// line.
func (r *reporter) standalone(p token.Position) bool {
	src, ok := r.src[p.Filename]
	if !ok {
		var err error
		read := r.pass.ReadFile
		if read == nil {
			read = os.ReadFile
		}
		src, err = read(p.Filename)
		if err != nil {
			src = nil
		}
		r.src[p.Filename] = src
	}
	if src == nil || p.Offset > len(src) {
		return true
	}
	start := bytes.LastIndexByte(src[:p.Offset], '\n') + 1
	return len(bytes.TrimSpace(src[start:p.Offset])) == 0
}

// report reports a finding at pos unless a suppression on its line or the
// line above covers it.
func (r *reporter) report(pos token.Pos, format string, args ...any) {
	p := r.pass.Fset.Position(pos)
	if m := r.byLine[p.Filename]; m != nil && len(m[p.Line]) > 0 {
		return
	}
	name := r.pass.Analyzer.Name
	r.pass.Report(analysis.Diagnostic{
		Pos:     pos,
		Message: "[" + name + "] " + sprintf(format, args...),
	})
}

// isTestFile reports whether f is a _test.go file: its calls go to test
// servers, and a checklist for production code would drown in them.
// A file whose name starts with "test" (test_helpers.go, testutil.go)
// holds helpers for tests kept outside _test.go files so several packages'
// tests can share them; it is treated the same way.
func isTestFile(pass *analysis.Pass, f *ast.File) bool {
	name := filepath.Base(pass.Fset.Position(f.Package).Filename)
	return strings.HasSuffix(name, "_test.go") || strings.HasPrefix(name, "test")
}
