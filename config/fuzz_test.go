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
	f.Add([]byte(grpcFile))
	f.Add([]byte(`{"dependencies": {"g": {"kind": "grpc", "reason": "r", "idempotent_methods": ["/a.B/", "x"], "failure_domain": "method", "routes": [{"method": "/a.B/C", "path": "/p"}]}}}`))
	f.Add([]byte("dependencies:\n  g:\n    kind: grpc\n    reason: r\n    idempotent: true\n    connect_timeout: 1s\n    max_buffered_messages: -1\n    breaker: {max_keys: 1, idle_ttl: -1s}\n    routes: [{method: /a.B/C}, {}]\n"))
	f.Add([]byte("defaults:\n  idempotent_methods: [/a.B/C]\n  failure_domain: target\ndependencies:\n  g: {kind: grpc, calls: [h]}\n  h: {kind: grpc, reason: r, max_attempts: 2, calls: [g]}\n"))
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
