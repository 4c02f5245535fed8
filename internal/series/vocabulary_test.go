package series

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// vocabulary returns the label values package event defines: the string
// constants named Outcome*, Attempt*, Reason* and Phase*, read from its
// source so that a value added or renamed there cannot be missed here.
func vocabulary(t *testing.T) map[string]string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), repoFile(t, "event/event.go"), nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string) // constant name -> value
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok || g.Tok != token.CONST {
			continue
		}
		for _, s := range g.Specs {
			vs := s.(*ast.ValueSpec)
			for i, name := range vs.Names {
				if i >= len(vs.Values) {
					continue
				}
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					continue
				}
				for _, p := range []string{"Outcome", "Attempt", "Reason", "Phase"} {
					if strings.HasPrefix(name.Name, p) {
						v, _ := strconv.Unquote(lit.Value)
						out[name.Name] = v
					}
				}
			}
		}
	}
	if len(out) < 30 {
		t.Fatalf("found only %d label values in package event: %v", len(out), out)
	}
	return out
}

// TestVocabularyDocumented: every outcome, attempt outcome, reason and
// phase of package event is listed in docs/metrics.md's label table and in
// the help text of a series, under the value the adapters export (they pass
// event values through unchanged).
func TestVocabularyDocumented(t *testing.T) {
	doc, err := os.ReadFile(repoFile(t, "docs/metrics.md"))
	if err != nil {
		t.Fatal(err)
	}
	labels, _, _ := strings.Cut(string(doc), "## Series")
	_, labels, _ = strings.Cut(labels, "## Labels")
	var help strings.Builder
	for _, d := range All {
		help.WriteString(d.Help + "\n")
	}
	for name, v := range vocabulary(t) {
		if !strings.Contains(labels, "`"+v+"`") {
			t.Errorf("event.%s (%q) is not in docs/metrics.md's label table", name, v)
		}
		if !regexp.MustCompile(`\b` + regexp.QuoteMeta(v) + `\b`).MatchString(help.String()) {
			t.Errorf("event.%s (%q) is in no series' help", name, v)
		}
	}
}

// repoFile returns the path of rel in the repository that holds this copy of
// the package, found by walking up to the directory with go.work (this
// package is kept in several modules, at several depths); outside the
// repository, as in a module zip, the test is skipped.
func repoFile(t *testing.T, rel string) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.work")); err == nil {
			return filepath.Join(dir, filepath.FromSlash(rel))
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skipf("%s: not inside the guardrail repository", rel)
		}
		dir = parent
	}
}
