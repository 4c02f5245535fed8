package config

import (
	"context"
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail"
)

// FuzzLoad: Parse never panics, every error it reports names the file
// and a line of it, and a file it accepts builds: New makes every value
// of it, and each policy runs a call.
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
	f.Add([]byte(hedgeFile))
	f.Add([]byte("defaults:\n  hedge: {delay: 10ms, percentile: 0.5, max_hedges: 3, window: 20, overload_pause: 1s}\n  throttle: {window: 1s, k: 1}\ndependencies:\n  a: {}\n  p: {kind: policy}\n  g: {kind: grpc}\n"))
	f.Add([]byte("dependencies:\n  a:\n    reason: r\n    hedge: {disabled: true, delay: 1s}\n    throttle: {disabled: true, k: 3}\n  b: {reason: r, hedge: {percentile: 0.999999, window: 2147483647}, throttle: {window: 1ns, k: 1e308}}\n"))
	f.Add([]byte(`{"dependencies": {"p": {"kind": "policy", "reason": "r", "hedge": {"delay": "-1ms", "percentile": 1, "max_hedges": -1, "window": 19, "overload_pause": "-1s"}, "throttle": {"window": "-1s", "k": 0.999}}}}`))
	f.Add([]byte("dependencies:\n  g: {kind: grpc, reason: r, hedge: {}, throttle: {k: 2}}\n  h: {reason: r, hedge: [1], throttle: 2}\n  p: {kind: policy, reason: r, hedge: {max_hedges: 2147483647}, routes: [{method: PUT, path: /x, idempotent: false}]}\n"))
	for _, tc := range brokenCopies {
		if strings.Count(string(doc), tc.old) == 1 {
			f.Add([]byte(strings.Replace(string(doc), tc.old, tc.new, 1)))
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := parse("f.yaml", data)
		lines := strings.Count(string(data), "\n") + 1
		if err != nil && len(c.Errors) == 0 {
			t.Fatalf("an error without diagnostics: %v", err)
		}
		for _, d := range append(c.Errors, c.Warnings...) {
			if d.File != "f.yaml" || d.Line < 1 || d.Line > lines+1 {
				t.Fatalf("diagnostic %q names line %d of a %d-line file", d, d.Line, lines)
			}
		}
		_ = c.report()
		if err != nil || len(data) > 4096 {
			return // building large files is slow and tells no more
		}
		reg, err := New("f.yaml", data, Options{Logger: quiet()})
		if err != nil {
			t.Fatalf("Parse accepted a file New does not build: %v", err)
		}
		for _, d := range c.Dependencies {
			if d.Kind != kindPolicy {
				continue
			}
			p, err := reg.Policy(d.Name)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := doHedged(context.Background(), p, guardrail.Call{}, func(context.Context) (int, error) { return 0, nil }); err != nil {
				t.Fatalf("policy %s, accepted by Parse, fails a call: %v", d.Name, err)
			}
		}
	})
}
