package config

import (
	"strings"
	"testing"
)

// FuzzLoad: Parse never panics, and every error it reports names the file
// and a line of it.
func FuzzLoad(f *testing.F) {
	doc := docExample(f)
	f.Add(doc)
	f.Add([]byte(testFile))
	f.Add([]byte(`{"dependencies": {"a": {"reason": "r", "attempt_timeout": "5"}}}`))
	f.Add([]byte("a: &x [*x]\n"))
	f.Add([]byte("dependencies:\n  a:\n    calls: [a]\n"))
	for _, tc := range brokenCopies {
		if strings.Count(string(doc), tc.old) == 1 {
			f.Add([]byte(strings.Replace(string(doc), tc.old, tc.new, 1)))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("f.yaml", data)
		lines := strings.Count(string(data), "\n") + 1
		if err != nil && len(c.Errors) == 0 {
			t.Fatalf("an error without diagnostics: %v", err)
		}
		for _, d := range append(c.Errors, c.Warnings...) {
			if d.File != "f.yaml" || d.Line < 1 || d.Line > lines+1 {
				t.Fatalf("diagnostic %q names line %d of a %d-line file", d, d.Line, lines)
			}
		}
		_ = c.Report()
	})
}
