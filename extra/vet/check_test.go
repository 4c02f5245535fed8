package vet_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail/extra/vet"
)

const demo = `package demo

import (
	"context"
	"net/http"
)

func Fetch(ctx context.Context) {
	req, _ := http.NewRequestWithContext(context.Background(), "GET", "http://x", nil)
	http.DefaultClient.Do(req)
	//guardrail:ignore timeout measured: this endpoint answers from memory
	http.Get("http://x")
}
`

// TestCheck runs the driver on a module of its own, the way the guardrail
// command does: each finding once, sorted, a suppressed one left out.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/demo\n\ngo 1.26\n")
	write("demo.go", demo)
	write("demo_test.go", "package demo\n\nimport \"net/http\"\n\nfunc helper() { http.Get(\"http://x\") }\n")
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	got, pkgErrs, err := vet.Check(context.Background(), vet.CheckConfig{Dir: dir, Env: env}, "./...")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgErrs) > 0 {
		t.Fatalf("package errors: %v", pkgErrs)
	}
	var lines []string
	for _, f := range got {
		lines = append(lines, filepath.Base(f.Pos.Filename)+":"+itoa(f.Pos.Line)+" "+f.Check)
	}
	want := []string{"demo.go:9 deadline", "demo.go:10 timeout"}
	if strings.Join(lines, "; ") != strings.Join(want, "; ") {
		t.Fatalf("findings = %v; want %v", lines, want)
	}
	if s := got[1].String(); !strings.HasSuffix(s, "demo.go:10:2: [timeout] http.DefaultClient has no timeout: a server that stops answering holds the call forever; use a client with Timeout (or guardhttp)") {
		t.Fatalf("String() = %q", s)
	}
}

func TestCheckNoPackages(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/empty\n\ngo 1.26\n"), 0o644)
	env := append(os.Environ(), "GOWORK=off")
	if _, _, err := vet.Check(context.Background(), vet.CheckConfig{Dir: dir, Env: env}, "./..."); err == nil {
		t.Fatal("no error for a pattern matching nothing")
	}
}

func TestByName(t *testing.T) {
	as, err := vet.ByName([]string{"stacked", "timeout"})
	if err != nil || len(as) != 2 || as[0].Name != "timeout" || as[1].Name != "stacked" {
		t.Fatalf("ByName = %v, %v; want timeout, stacked in Analyzers order", as, err)
	}
	if _, err := vet.ByName([]string{"tiemout"}); err == nil || !strings.Contains(err.Error(), `"tiemout"`) {
		t.Fatalf("ByName(tiemout) error = %v", err)
	}
}

func itoa(n int) string {
	return strconv.Itoa(n)
}
