package main

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail/extra/vet"
)

const vetDemo = `package demo

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

// TestVetCheck runs the driver on a module of its own: each finding once,
// sorted, a suppressed one left out.
func TestVetCheck(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/demo\n\ngo 1.26\n")
	write("demo.go", vetDemo)
	write("demo_test.go", "package demo\n\nimport \"net/http\"\n\nfunc helper() { http.Get(\"http://x\") }\n")
	env := append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
	got, pkgErrs, err := vetCheck(context.Background(), dir, env, vet.Analyzers(), "./...")
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgErrs) > 0 {
		t.Fatalf("package errors: %v", pkgErrs)
	}
	var lines []string
	for _, f := range got {
		lines = append(lines, filepath.Base(f.pos.Filename)+":"+strconv.Itoa(f.pos.Line)+" "+f.check)
	}
	want := []string{"demo.go:9 deadline", "demo.go:10 timeout"}
	if strings.Join(lines, "; ") != strings.Join(want, "; ") {
		t.Fatalf("findings = %v; want %v", lines, want)
	}
	if s := got[1].String(); !strings.HasSuffix(s, "demo.go:10:2: [timeout] http.DefaultClient has no timeout: a server that stops answering holds the call forever; use a client with Timeout (or guardhttp)") {
		t.Fatalf("String() = %q", s)
	}
}

func TestVetCheckNoPackages(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "go.mod"), []byte("module example.com/empty\n\ngo 1.26\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "GOWORK=off")
	if _, _, err := vetCheck(context.Background(), dir, env, vet.Analyzers(), "./..."); err == nil {
		t.Fatal("no error for a pattern matching nothing")
	}
}
