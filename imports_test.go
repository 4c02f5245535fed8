package guardrail_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// corePackages returns the directories of the core module's packages:
// every directory with Go files under the module root that is not inside
// another module (a directory with a go.mod of its own) or a testdata
// directory.
func corePackages(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		if path != "." {
			if d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil {
				return filepath.SkipDir
			}
		}
		if files, _ := filepath.Glob(filepath.Join(path, "*.go")); len(files) > 0 {
			dirs = append(dirs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestCorePackagesImportOnlyTheStandardLibrary: the core packages import
// only the standard library and each other, so that a user of the core
// pulls in no third-party module.
func TestCorePackagesImportOnlyTheStandardLibrary(t *testing.T) {
	const module = "github.com/guardrail-go/guardrail"
	dirs := corePackages(t)
	allowed := map[string]bool{module: true}
	for _, d := range dirs {
		allowed[module+"/"+filepath.ToSlash(d)] = true
	}
	checked := 0
	for _, dir := range dirs {
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
	if len(dirs) < 10 || checked < 20 {
		t.Fatalf("checked only %d files in %d packages; is the test running from the module root?", checked, len(dirs))
	}
}
