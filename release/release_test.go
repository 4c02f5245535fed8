package release

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/mod/modfile"
	"golang.org/x/mod/module"
	"golang.org/x/mod/zip"
)

const (
	prefix  = "github.com/guardrail-go/guardrail"
	version = "v0.1.0"
)

// pinned are the third-party modules a consumer pins; the guardrail
// modules must not move them.
var pinned = []string{
	"github.com/prometheus/client_golang",
	"go.opentelemetry.io/otel",
	"github.com/redis/go-redis/v9",
	"github.com/jackc/pgx/v5",
}

// pinnedImports are packages of the pinned modules a consumer imports, so
// that tidy keeps the requirements.
var pinnedImports = []string{
	"github.com/prometheus/client_golang/prometheus",
	"go.opentelemetry.io/otel",
	"github.com/redis/go-redis/v9",
	"github.com/jackc/pgx/v5",
}

type mod struct {
	dir  string // absolute
	path string
	file *modfile.File
}

func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// publishedModules lists the core, every extra/* and cmd/guardrail.
func publishedModules(t *testing.T, root string) []mod {
	t.Helper()
	dirs := []string{root}
	extras, err := filepath.Glob(filepath.Join(root, "extra", "*", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range extras {
		dirs = append(dirs, filepath.Dir(e))
	}
	dirs = append(dirs, filepath.Join(root, "cmd", "guardrail"))
	var mods []mod
	for _, d := range dirs {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		f, err := modfile.ParseLax(filepath.Join(d, "go.mod"), data, nil)
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, mod{dir: d, path: f.Module.Mod.Path, file: f})
	}
	return mods
}

// pinnedVersions reads the versions of the pinned modules from the tree's
// go.mod files; they must agree.
func pinnedVersions(t *testing.T, mods []mod) map[string]string {
	t.Helper()
	vs := map[string]string{}
	for _, m := range mods {
		for _, r := range m.file.Require {
			for _, p := range pinned {
				if r.Mod.Path != p {
					continue
				}
				if v, ok := vs[p]; ok && v != r.Mod.Version {
					t.Fatalf("the tree requires %s at both %s and %s", p, v, r.Mod.Version)
				}
				vs[p] = r.Mod.Version
			}
		}
	}
	for _, p := range pinned {
		if vs[p] == "" {
			t.Fatalf("no go.mod of the tree requires %s", p)
		}
	}
	return vs
}

// publish writes every module at version into dir, laid out as a
// file-system GOPROXY.
func publish(t *testing.T, dir string, mods []mod) {
	t.Helper()
	info := fmt.Sprintf("{\"Version\":%q,\"Time\":%q}\n", version, time.Now().UTC().Format(time.RFC3339))
	for _, m := range mods {
		esc, err := module.EscapePath(m.path)
		if err != nil {
			t.Fatal(err)
		}
		vdir := filepath.Join(dir, filepath.FromSlash(esc), "@v")
		if err := os.MkdirAll(vdir, 0o755); err != nil {
			t.Fatal(err)
		}
		z, err := os.Create(filepath.Join(vdir, version+".zip"))
		if err != nil {
			t.Fatal(err)
		}
		if err := zip.CreateFromDir(z, module.Version{Path: m.path, Version: version}, m.dir); err != nil {
			z.Close()
			t.Fatalf("zip %s: %v", m.path, err)
		}
		if err := z.Close(); err != nil {
			t.Fatal(err)
		}
		gomod, err := os.ReadFile(filepath.Join(m.dir, "go.mod"))
		if err != nil {
			t.Fatal(err)
		}
		for name, data := range map[string][]byte{
			version + ".mod":  gomod,
			version + ".info": []byte(info),
			"list":            []byte(version + "\n"),
		} {
			if err := os.WriteFile(filepath.Join(vdir, name), data, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// publicPackages lists the non-internal, non-main packages of m that have
// non-test Go files.
func publicPackages(t *testing.T, m mod) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-e", "-f", "{{if .GoFiles}}{{.ImportPath}} {{.Name}}{{end}}", "./...")
	cmd.Dir = m.dir
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list in %s: %v", m.dir, err)
	}
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || f[1] == "main" {
			continue
		}
		p := f[0]
		if p == "internal" || strings.Contains(p, "/internal/") || strings.HasSuffix(p, "/internal") {
			continue
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

type runner struct {
	t   *testing.T
	env []string
}

func (r runner) run(dir string, args ...string) string {
	r.t.Helper()
	out, err := r.try(dir, args...)
	if err != nil {
		r.t.Fatalf("%s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return out
}

func (r runner) try(dir string, args ...string) (string, error) {
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = dir
	cmd.Env = r.env
	var buf bytes.Buffer
	cmd.Stdout = &buf
	cmd.Stderr = &buf
	err := cmd.Run()
	return buf.String(), err
}

// writeConsumer writes a module that requires reqs and imports imports.
func writeConsumer(t *testing.T, dir, name string, reqs map[string]string, imports []string) {
	t.Helper()
	var gomod strings.Builder
	fmt.Fprintf(&gomod, "module example.com/%s\n\ngo 1.26.0\n\nrequire (\n", name)
	var paths []string
	for p := range reqs {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		fmt.Fprintf(&gomod, "\t%s %s\n", p, reqs[p])
	}
	gomod.WriteString(")\n")
	var src strings.Builder
	src.WriteString("// Command consumer imports the published guardrail packages.\npackage main\n\nimport (\n")
	sort.Strings(imports)
	for _, p := range imports {
		fmt.Fprintf(&src, "\t_ %q\n", p)
	}
	src.WriteString(")\n\nfunc main() {}\n")
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte(gomod.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "main.go"), []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func checkPins(t *testing.T, r runner, dir string, want map[string]string) {
	t.Helper()
	for _, p := range pinned {
		got := strings.TrimSpace(r.run(dir, "go", "list", "-m", "-f", "{{.Version}}", p))
		if got != want[p] {
			t.Errorf("%s: after tidy %s is at %s, pinned at %s", dir, p, got, want[p])
		}
	}
}

func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("GUARDRAIL_TEST_RELEASE_REQUIRED") == "1" {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// TestRelease publishes every module of the tree at v0.1.0 to a file
// proxy, then builds and vets a consumer outside the repository that
// imports every public package, and checks that the core leaves a
// consumer's pins of the heavy third-party modules where they are.
func TestRelease(t *testing.T) {
	if testing.Short() {
		skipOrFail(t, "release test: skipped in -short mode (it builds every module from a file proxy)")
	}
	root := repoRoot(t)
	mods := publishedModules(t, root)
	pins := pinnedVersions(t, mods)

	proxy := t.TempDir()
	publish(t, proxy, mods)

	// A private module cache, so that no earlier run's v0.1.0 is reused;
	// the shared cache's downloads serve as a second file proxy.
	cache := t.TempDir()
	shared, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		t.Fatalf("go env GOMODCACHE: %v", err)
	}
	goproxy := "file://" + filepath.ToSlash(proxy)
	if s := strings.TrimSpace(string(shared)); s != "" {
		if _, err := os.Stat(filepath.Join(s, "cache", "download")); err == nil {
			goproxy += ",file://" + filepath.ToSlash(filepath.Join(s, "cache", "download"))
		}
	}
	goproxy += ",https://proxy.golang.org"
	env := append(os.Environ(),
		"GOWORK=off",
		"GOFLAGS=-mod=mod -modcacherw",
		"GOPROXY="+goproxy,
		"GOMODCACHE="+cache,
		"GONOSUMDB="+prefix+"/*,"+prefix,
		"GONOSUMCHECK=1",
		"GOPRIVATE=",
		"GONOPROXY=",
		"GOTOOLCHAIN=local",
	)
	r := runner{t: t, env: env}

	probe := t.TempDir()
	if err := os.WriteFile(filepath.Join(probe, "go.mod"), []byte("module example.com/probe\n\ngo 1.26.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := r.try(probe, "go", "mod", "download", "-json", pinned[0]+"@"+pins[pinned[0]]); err != nil {
		skipOrFail(t, "release test: the module proxy cannot be reached (go mod download %s@%s failed): %v\n%s",
			pinned[0], pins[pinned[0]], err, out)
	}

	reqs := map[string]string{}
	for p, v := range pins {
		reqs[p] = v
	}
	var imports []string
	for _, m := range mods {
		reqs[m.path] = version
		imports = append(imports, publicPackages(t, m)...)
	}
	imports = append(imports, pinnedImports...)

	t.Run("all", func(t *testing.T) {
		r := runner{t: t, env: env}
		dir := t.TempDir()
		writeConsumer(t, dir, "consumer", reqs, imports)
		r.run(dir, "go", "mod", "tidy")
		r.run(dir, "go", "build", "./...")
		r.run(dir, "go", "vet", "./...")
		checkPins(t, r, dir, pins)
	})

	t.Run("core", func(t *testing.T) {
		r := runner{t: t, env: env}
		dir := t.TempDir()
		reqs := map[string]string{prefix: version}
		for p, v := range pins {
			reqs[p] = v
		}
		writeConsumer(t, dir, "coreconsumer", reqs,
			append([]string{prefix, prefix + "/guardhttp"}, pinnedImports...))
		r.run(dir, "go", "mod", "tidy")
		r.run(dir, "go", "build", "./...")
		checkPins(t, r, dir, pins)
	})
}
