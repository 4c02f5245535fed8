package guardrail_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"
)

// consumerPins are the modules of a typical service that adopts guardrail,
// at versions it pinned before, with one package of each that it uses.
var consumerPins = []struct{ path, version, pkg, use string }{
	{"github.com/prometheus/client_golang", "v1.20.0", "github.com/prometheus/client_golang/prometheus", "prometheus.NewRegistry"},
	{"go.opentelemetry.io/otel", "v1.30.0", "go.opentelemetry.io/otel", "otel.Tracer"},
	{"github.com/redis/go-redis/v9", "v9.17.3", "github.com/redis/go-redis/v9", "redis.NewClient"},
	{"github.com/jackc/pgx/v5", "v5.7.6", "github.com/jackc/pgx/v5", "pgx.Connect"},
}

// TestConsumerPullsInNoThirdPartyModule builds the go.mod of a service
// that already uses Prometheus, OpenTelemetry, go-redis and pgx, adds
// guardrail and guardhttp to it, and runs go mod tidy: the four pinned
// versions must stay as they were, and guardrail must bring no module into
// go.sum but the helpers of its own tests (its go.mod's requirements and
// theirs), which it needs for nothing a consumer builds. The same consumer
// without guardrail, tidied alike, tells which modules the four bring.
func TestConsumerPullsInNoThirdPartyModule(t *testing.T) {
	if testing.Short() {
		t.Skip("tidies two modules from the Go module proxy")
	}
	start := time.Now()
	goTool, env := goCommand(t)
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	gomod := func(dir string) modFile {
		t.Helper()
		var m modFile
		if err := json.Unmarshal(runGo(t, goTool, env, dir, "mod", "edit", "-json"), &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	core := gomod(root)
	if core.Module.Path != "github.com/guardrail-go/guardrail" {
		t.Fatalf("module root %s holds %s", root, core.Module.Path)
	}

	// The helpers: every module of the core's own graph.
	helpers := map[string]bool{}
	for _, line := range strings.Split(string(runGo(t, goTool, env, root, "mod", "graph")), "\n") {
		for _, node := range strings.Fields(line) {
			if strings.HasPrefix(node, "go@") || strings.HasPrefix(node, "toolchain@") || !strings.Contains(node, "@") {
				continue
			}
			path, version, _ := strings.Cut(node, "@")
			helpers[path+" "+version] = true
		}
	}
	// And they are helpers of tests only: no package of the core imports
	// a package of another module (one that does is no helper).
	for _, mod := range strings.Fields(string(runGo(t, goTool, env, root, "list", "-deps", "-f", "{{with .Module}}{{.Path}}@{{.Version}}{{end}}", "./..."))) {
		path, version, _ := strings.Cut(mod, "@")
		if path != core.Module.Path {
			t.Errorf("a package of the core depends on module %s; the core must build from the standard library alone", mod)
			delete(helpers, path+" "+version)
		}
	}

	without := writeConsumer(t, core.Go, "", "")
	with := writeConsumer(t, core.Go, core.Module.Path, root)

	// The consumer without guardrail needs the proxy: when it cannot be
	// tidied, the proxy is out of reach, and that is no finding about
	// guardrail (but CI has the proxy, and there it is a failure).
	if proxy := strings.TrimSpace(string(runGo(t, goTool, env, without, "env", "GOPROXY"))); proxy == "off" {
		skipOrFail(t, "GOPROXY=off: the consumer's modules cannot be downloaded")
	}
	if out, err := goCmd(goTool, env, without, "mod", "tidy"); err != nil {
		skipOrFail(t, fmt.Sprintf("go mod tidy of the consumer without guardrail failed, so the module proxy is out of reach: %v\n%s", err, out))
	}
	if out, err := goCmd(goTool, env, with, "mod", "tidy"); err != nil {
		t.Fatalf("go mod tidy of the consumer with guardrail: %v\n%s", err, out)
	}

	// Read go.sum now: go list -m all, below, adds the go.mod sums of the
	// whole module graph.
	sumBefore, sumAfter := sumModules(t, without), sumModules(t, with)

	// The pins hold, and guardrail adds one requirement: itself.
	before, after := gomod(without), gomod(with)
	for _, pin := range consumerPins {
		for _, m := range []modFile{before, after} {
			if v := m.version(pin.path); v != pin.version {
				t.Errorf("%s: go mod tidy selected %s %s, want the pinned %s", m.Module.Path, pin.path, v, pin.version)
			}
		}
	}
	// Nor does any other module the consumer builds with change version.
	selected := func(dir string) map[string]string {
		t.Helper()
		out := map[string]string{}
		for _, line := range strings.Split(string(runGo(t, goTool, env, dir, "list", "-m", "-f", "{{.Path}} {{.Version}}", "all")), "\n") {
			if path, version, ok := strings.Cut(line, " "); ok {
				out[path] = version
			}
		}
		return out
	}
	listBefore, listAfter := selected(without), selected(with)
	for path, v := range listBefore {
		if listAfter[path] != v {
			t.Errorf("guardrail moved the consumer's %s from %s to %s", path, v, listAfter[path])
		}
	}
	var added []string
	for _, r := range after.Require {
		if before.version(r.Path) != r.Version {
			added = append(added, r.Path+" "+r.Version)
		}
	}
	if want := []string{core.Module.Path + " v0.0.0"}; !slices.Equal(added, want) {
		t.Errorf("guardrail changed the consumer's requirements by %q, want only %q", added, want)
	}

	// go.sum names nothing new but the core's test helpers.
	var extra []string
	for m := range sumAfter {
		if !sumBefore[m] && !helpers[m] {
			extra = append(extra, m)
		}
	}
	slices.Sort(extra)
	if len(extra) > 0 {
		t.Errorf("guardrail and guardhttp brought into the consumer's go.sum %d module version(s) that are not test helpers of the core:\n  %s",
			len(extra), strings.Join(extra, "\n  "))
	}
	var fromHelpers []string
	for m := range sumAfter {
		if !sumBefore[m] && helpers[m] {
			fromHelpers = append(fromHelpers, m)
		}
	}
	slices.Sort(fromHelpers)
	t.Logf("%d go.sum modules without guardrail, %d with; the core's test helpers among them: %q; took %v",
		len(sumBefore), len(sumAfter), fromHelpers, time.Since(start).Round(100*time.Millisecond))
}

// goCommand returns the go command of the toolchain that built this test
// and the environment to run it in: no workspace, modules resolved from
// go.mod (downloading as needed), and that same toolchain even where a
// go.mod would ask for another.
func goCommand(t *testing.T) (string, []string) {
	t.Helper()
	goTool := "go"
	if goroot := os.Getenv("GOROOT"); goroot != "" {
		goTool = filepath.Join(goroot, "bin", "go")
	}
	goTool, err := exec.LookPath(goTool)
	if err != nil {
		t.Skipf("no go command to tidy a consumer with: %v", err)
	}
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	if v := runtime.Version(); strings.HasPrefix(v, "go1.") && !strings.ContainsAny(v, " -+") {
		env = append(env, "GOTOOLCHAIN="+v)
	} else {
		env = append(env, "GOTOOLCHAIN=local") // a development toolchain
	}
	return goTool, env
}

func goCmd(goTool string, env []string, dir string, args ...string) ([]byte, error) {
	cmd := exec.Command(goTool, args...)
	cmd.Dir, cmd.Env = dir, env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return append(out, stderr.Bytes()...), err
	}
	return out, nil
}

func runGo(t *testing.T, goTool string, env []string, dir string, args ...string) []byte {
	t.Helper()
	out, err := goCmd(goTool, env, dir, args...)
	if err != nil {
		t.Fatalf("go %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return out
}

// skipOrFail skips the test, except in CI, where the proxy is reachable and
// not reaching it is a failure.
func skipOrFail(t *testing.T, msg string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatalf("%s (CI is set: the consumer check must run here)", msg)
	}
	t.Skip(msg)
}

// writeConsumer writes the consumer's module in a directory of its own:
// the four pinned modules, used, and, when guardrail is not empty,
// guardrail and guardhttp from the module at root.
func writeConsumer(t *testing.T, goVersion, guardrail, root string) string {
	t.Helper()
	dir := t.TempDir()
	var mod, src strings.Builder
	fmt.Fprintf(&mod, "module example.com/consumer\n\ngo %s\n\nrequire (\n", goVersion)
	src.WriteString("package main\n\nimport (\n")
	for _, p := range consumerPins {
		fmt.Fprintf(&mod, "\t%s %s\n", p.path, p.version)
		fmt.Fprintf(&src, "\t%q\n", p.pkg)
	}
	if guardrail != "" {
		fmt.Fprintf(&mod, "\t%s v0.0.0\n", guardrail)
		fmt.Fprintf(&src, "\t%q\n\t%q\n", guardrail, guardrail+"/guardhttp")
	}
	mod.WriteString(")\n")
	if guardrail != "" {
		fmt.Fprintf(&mod, "\nreplace %s => %s\n", guardrail, root)
	}
	src.WriteString(")\n\nvar _ = []any{\n")
	for _, p := range consumerPins {
		fmt.Fprintf(&src, "\t%s,\n", p.use)
	}
	if guardrail != "" {
		src.WriteString("\tguardrail.Do[struct{}],\n\tguardhttp.NewTransport,\n")
	}
	src.WriteString("}\n\nfunc main() {}\n")
	for name, data := range map[string]string{"go.mod": mod.String(), "main.go": src.String()} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// modFile is what go mod edit -json says of a go.mod.
type modFile struct {
	Module  struct{ Path string }
	Go      string
	Require []struct {
		Path     string
		Version  string
		Indirect bool
	}
}

func (m modFile) version(path string) string {
	for _, r := range m.Require {
		if r.Path == path {
			return r.Version
		}
	}
	return ""
}

// sumModules returns the "path version" of every module go.sum names, for
// its content or its go.mod alone.
func sumModules(t *testing.T, dir string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			continue
		}
		out[f[0]+" "+strings.TrimSuffix(f[1], "/go.mod")] = true
	}
	return out
}
