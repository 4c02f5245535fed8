package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// snippet is one ```go block of README.md or docs/*.md.
type snippet struct {
	file string // relative to the repository's root
	line int    // of the block's first line of code
	src  string
}

// readSnippets returns the Go blocks of README.md and docs/*.md.
func readSnippets(t *testing.T, root string) []snippet {
	t.Helper()
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	var out []snippet
	for _, path := range append([]string{filepath.Join(root, "README.md")}, docs...) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, path)
		var cur *snippet
		sc := bufio.NewScanner(bytes.NewReader(data))
		for n := 1; sc.Scan(); n++ {
			line := sc.Text()
			switch {
			case cur == nil && strings.TrimSpace(line) == "```go":
				cur = &snippet{file: rel, line: n + 1}
			case cur != nil && strings.TrimSpace(line) == "```":
				out = append(out, *cur)
				cur = nil
			case cur != nil:
				cur.src += line + "\n"
			}
		}
	}
	return out
}

// packageNames maps the name a snippet uses for a package to its import
// path: every public package of guardrail's modules, and the standard and
// third-party packages the docs use.
func packageNames(t *testing.T, root string) map[string]string {
	t.Helper()
	names := map[string]string{
		"context": "context", "errors": "errors", "fmt": "fmt", "http": "net/http",
		"httptest": "net/http/httptest", "time": "time", "log": "log", "slog": "log/slog",
		"net": "net", "os": "os", "signal": "os/signal", "syscall": "syscall",
		"subtle": "crypto/subtle", "sha256": "crypto/sha256", "json": "encoding/json",
		"io": "io", "strings": "strings", "strconv": "strconv", "sync": "sync",
		"atomic": "sync/atomic", "rand": "math/rand/v2", "url": "net/url", "httptrace": "net/http/httptrace",
		"grpc": "google.golang.org/grpc", "codes": "google.golang.org/grpc/codes",
		"status": "google.golang.org/grpc/status", "metadata": "google.golang.org/grpc/metadata",
		"credentials": "google.golang.org/grpc/credentials", "insecure": "google.golang.org/grpc/credentials/insecure",
		"redis": "github.com/redis/go-redis/v9", "pgxpool": "github.com/jackc/pgx/v5/pgxpool",
		"prometheus": "github.com/prometheus/client_golang/prometheus",
		"promhttp":   "github.com/prometheus/client_golang/prometheus/promhttp",
	}
	cmd := exec.Command("go", "list", "-f", "{{.Name}} {{.ImportPath}}", "github.com/guardrail-go/guardrail/...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		name, path, _ := strings.Cut(line, " ")
		if strings.Contains(path, "/internal") || strings.Contains(path, "/cmd/") ||
			strings.HasSuffix(path, "/bench") || strings.Contains(path, "/bench/") ||
			strings.HasSuffix(path, "/integration") || strings.HasSuffix(path, "/release") || name == "main" {
			continue
		}
		names[name] = path
	}
	return names
}

// ellipsis is the "..." that stands for code left out: `{ ... }`,
// `charge(...)`.
var ellipsis = regexp.MustCompile(`\{\s*\.\.\.\s*\}|\(\s*\.\.\.\s*\)`)

// prepare turns a snippet into a Go file, with the imports of the
// packages it names and statements wrapped in a function, and returns its
// import paths.
func prepare(s snippet, names map[string]string, pkg string) (string, []string, error) {
	src := ellipsis.ReplaceAllStringFunc(s.src, func(m string) string {
		if m[0] == '{' {
			return "{}"
		}
		return "()"
	})
	fset := token.NewFileSet()
	body := src
	f, err := parser.ParseFile(fset, "", "package "+pkg+"\n"+src, parser.ParseComments)
	if err != nil {
		// Statements: wrap them in a function returning an error, as most
		// snippets return one.
		body = "func _() error {\n" + src + "\nreturn nil\n}\n"
		if f, err = parser.ParseFile(fset, "", "package "+pkg+"\n"+body, parser.ParseComments); err != nil {
			return "", nil, err
		}
	}
	// What the snippet defines itself is not a package, whatever its name.
	defined := make(map[string]bool)
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				for _, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok {
						defined[id.Name] = true
					}
				}
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				defined[id.Name] = true
			}
		case *ast.Field:
			for _, id := range n.Names {
				defined[id.Name] = true
			}
		case *ast.FuncDecl:
			defined[n.Name.Name] = true
		}
		return true
	})
	used := make(map[string]bool)
	ast.Inspect(f, func(n ast.Node) bool {
		if sel, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := sel.X.(*ast.Ident); ok && !defined[id.Name] && names[id.Name] != "" {
				used[id.Name] = true
			}
		}
		return true
	})
	var imports []string
	var b strings.Builder
	fmt.Fprintf(&b, "package %s\n\nimport (\n", pkg)
	for _, name := range slices.Sorted(func(yield func(string) bool) {
		for k := range used {
			if !yield(k) {
				return
			}
		}
	}) {
		fmt.Fprintf(&b, "\t%s %q\n", name, names[name])
		imports = append(imports, names[name])
	}
	b.WriteString(")\n\n")
	b.WriteString(body)
	return b.String(), imports, nil
}

// tolerated are the errors a snippet may have for what it leaves to the
// prose around it: names it does not define (ctx, mux, the user's own
// handler), variables it declares for show, several := of err, and
// returns that fit the function the reader's code is in.
var tolerated = regexp.MustCompile(`(?s)^(undefined: [A-Za-z_][A-Za-z0-9_]*` +
	`|declared and not used: .*` +
	`|no new variables on left side of :=` +
	`|.* redeclared in this block` +
	`|too many return values.*` +
	`|not enough return values.*` +
	`|missing return` +
	`|"[^"]+" imported( as \w+)? and not used)$`)

// TestDocsCompile type-checks every Go block of README.md and docs/*.md
// against the packages of the workspace, so that a renamed field, a
// function whose results changed, or a removed identifier fails here the
// day the docs drift. The names a block leaves to its prose (ctx, mux, a
// handler of the reader's) are allowed to be undefined; anything the
// block asks of a package must exist and type-check.
func TestDocsCompile(t *testing.T) {
	if testing.Short() {
		t.Skip("type-checking the docs builds every module's export data; skipped with -short")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	snippets := readSnippets(t, root)
	if len(snippets) < 20 {
		t.Fatalf("found %d Go blocks in README.md and docs/; the reader lost them", len(snippets))
	}
	names := packageNames(t, root)

	type prepared struct {
		s       snippet
		src     string
		imports []string
	}
	var all []prepared
	need := map[string]bool{}
	for _, s := range snippets {
		src, imports, err := prepare(s, names, "snippet")
		if err != nil {
			t.Errorf("%s:%d: the block does not parse as Go: %v", s.file, s.line, err)
			continue
		}
		for _, p := range imports {
			need[p] = true
		}
		all = append(all, prepared{s, src, imports})
	}

	exports := exportData(t, root, slices.Sorted(func(yield func(string) bool) {
		for k := range need {
			if !yield(k) {
				return
			}
		}
	}))
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		file, ok := exports[path]
		if !ok {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(file)
	})
	for _, p := range all {
		f, err := parser.ParseFile(fset, p.s.file, p.src, 0)
		if err != nil {
			t.Errorf("%s:%d: %v", p.s.file, p.s.line, err)
			continue
		}
		var bad []string
		conf := types.Config{Importer: imp, Error: func(err error) {
			if te, ok := err.(types.Error); ok && tolerated.MatchString(te.Msg) {
				return
			}
			bad = append(bad, err.Error())
		}}
		_, _ = conf.Check("snippet", fset, []*ast.File{f}, nil)
		for _, e := range bad {
			t.Errorf("%s:%d: the block does not type-check: %s\n%s", p.s.file, p.s.line, e, p.src)
		}
	}
}

// exportData builds the packages and returns where the compiler wrote
// each one's export data, for it and everything it imports.
func exportData(t *testing.T, root string, pkgs []string) map[string]string {
	t.Helper()
	args := append([]string{"list", "-export", "-deps", "-json=ImportPath,Export"}, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = root
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	exports := make(map[string]string)
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p struct{ ImportPath, Export string }
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		if p.Export != "" {
			exports[p.ImportPath] = p.Export
		}
	}
	return exports
}
