package guardrail_test

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// corePackages may import only the standard library and each other, so that
// a user of the core pulls in no third-party module.
var corePackages = []string{".", "event", "backoff", "budget", "breaker", "bulkhead", "deadline", "shed", "fallback"}

func TestCorePackagesImportOnlyTheStandardLibrary(t *testing.T) {
	const module = "github.com/guardrail-go/guardrail"
	allowed := map[string]bool{module: true}
	for _, p := range corePackages[1:] {
		allowed[module+"/"+p] = true
	}
	checked := 0
	for _, dir := range corePackages {
		files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			af, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			checked++
			for _, imp := range af.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				first, _, _ := strings.Cut(path, "/")
				if strings.Contains(first, ".") && !allowed[path] {
					t.Errorf("%s imports %s: core packages may use only the standard library", f, path)
				}
			}
		}
	}
	if checked < 5 {
		t.Fatalf("checked only %d files; is the test running from the module root?", checked)
	}
}
