package integration

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestSeriesCopiesMatch holds the copies of the core's metric vocabulary in
// extra/prom and extra/otel identical to the core's internal/series: each
// module must keep its own copy (no module imports another's internal
// package), and `go generate ./internal/series` remakes them.
func TestSeriesCopiesMatch(t *testing.T) {
	src := filepath.Join("..", "internal", "series")
	files, err := filepath.Glob(filepath.Join(src, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no source files in %s: %v", src, err)
	}
	for _, m := range []string{"prom", "otel"} {
		dst := filepath.Join("..", "extra", m, "internal", "series")
		copies, _ := filepath.Glob(filepath.Join(dst, "*.go"))
		if got, want := len(copies), len(files); got != want {
			t.Errorf("%s holds %d files, %s holds %d; run go generate ./internal/series", dst, got, src, want)
		}
		for _, f := range files {
			a, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(filepath.Join(dst, filepath.Base(f)))
			if err != nil || !bytes.Equal(a, b) {
				t.Errorf("%s differs from %s (%v); run go generate ./internal/series", filepath.Join(dst, filepath.Base(f)), f, err)
			}
		}
	}
}
