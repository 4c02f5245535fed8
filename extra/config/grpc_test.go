package config

import (
	"context"
	"encoding/json"
	"errors"
	"go/parser"
	"go/token"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"

	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
)

const grpcFile = `
defaults:
  max_attempts: 3
  backoff: {strategy: none}
  retry_budget: {ratio: 0.5, max: 100}
  connect_timeout: 1s
dependencies:
  inventory:
    kind: grpc
    reason: "tests"
    attempt_timeout: 300ms
    deadline: 2s
    idempotent_methods: [/inventory.v1.Stock/, /inventory.v1.Reservations/Get]
    max_buffered_messages: 8
    failure_domain: method
    breaker: {min_requests: 10, consecutive_failures: 4, max_keys: 50}
    bulkhead: {max_concurrent: 16}
  pricing:
    kind: grpc
    reason: "tests"
    max_attempts: 1
  web:
    reason: "tests"
    max_attempts: 1
`

func quietRegistry(t *testing.T, file string) *Registry {
	t.Helper()
	reg, err := New("policy.yaml", []byte(file), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

// A grpc dependency resolves to the guardgrpc.ClientConfig fields of the
// same names, in core types; the defaults' HTTP keys do not reach it.
func TestGRPCDependencyResolves(t *testing.T) {
	c, err := parse("policy.yaml", []byte(grpcFile))
	if err != nil {
		t.Fatal(err)
	}
	d := c.dependency("inventory")
	if d.Kind != kindGRPC {
		t.Fatalf("kind %q; want grpc", d.Kind)
	}
	want := GRPCSettings{
		Name:                "inventory",
		Retry:               guardrail.Retry{MaxAttempts: 3, AttemptTimeout: 300 * time.Millisecond, Backoff: backoff.None()},
		IdempotentMethods:   []string{"/inventory.v1.Stock/", "/inventory.v1.Reservations/Get"},
		MaxBufferedMessages: 8, ByMethod: true,
		Bulkhead: &bulkhead.Config{MaxConcurrent: 16}, Deadline: 2 * time.Second,
	}
	if !reflect.DeepEqual(d.GRPC, want) {
		t.Errorf("resolved\n%+v\nwant\n%+v", d.GRPC, want)
	}
	if g := d.Group; g.MaxKeys != 50 || g.Config.ConsecutiveFailures != 4 || g.Config.MinRequests != 10 {
		t.Errorf("breaker group %+v; want max_keys 50, consecutive_failures 4, min_requests 10", g)
	}
	if p := c.dependency("pricing").GRPC; p.ByMethod || p.MaxAttempts != 1 {
		t.Errorf("pricing %+v; want failure domain target, 1 attempt", p)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings: %v", c.Warnings)
	}
}

// The Registry hands out a handle whose value changes only when the
// dependency's settings do, and keeps the breakers, budget and bulkhead
// compartments whose own settings did not change.
func TestGRPCHandleFollowsReload(t *testing.T) {
	reg := quietRegistry(t, grpcFile)
	h, err := reg.GRPC("inventory")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.GRPC("web"); !errors.Is(err, ErrUnknown) {
		t.Errorf("GRPC of an HTTP dependency: %v; want ErrUnknown", err)
	}
	if _, err := reg.HTTPClient("inventory"); !errors.Is(err, ErrUnknown) {
		t.Errorf("HTTPClient of a gRPC dependency: %v; want ErrUnknown", err)
	}
	s := h.Current()
	if s.Budget == nil || s.Budget.Max() != 100 || s.Breakers == nil || s.Bulkheads == nil || s.Bulkheads.Get("k").Limit() != 16 {
		t.Fatalf("settings %+v; want the Registry's budget (max 100), breakers and compartments of 16", s)
	}
	br := s.Breakers.Get("dns:///inventory/inventory.v1.Stock/Get")
	br.ForceOpen()
	slot, err := s.Bulkheads.Get("k").Acquire(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer slot.Release()

	reload := func(old, new string) []string {
		t.Helper()
		var changed []string
		reg.opts.OnReload = func(r ReloadResult) { changed = r.Changed }
		if err := reg.ReloadBytes([]byte(strings.Replace(grpcFile, old, new, 1))); err != nil {
			t.Fatal(err)
		}
		return changed
	}
	if changed := reload("  web:\n    reason: \"tests\"\n    max_attempts: 1", "  web:\n    reason: \"tests\"\n    max_attempts: 2"); h.Current() != s || contains(changed, "inventory") {
		t.Errorf("a reload of another dependency changed inventory's settings (changed %v)", changed)
	}
	if changed := reload("attempt_timeout: 300ms", "attempt_timeout: 400ms"); !contains(changed, "inventory") {
		t.Errorf("changed %v; want inventory", changed)
	}
	now := h.Current()
	if now == s || now.AttemptTimeout != 400*time.Millisecond {
		t.Fatalf("after a reload of the attempt timeout: same value %v, timeout %v; want a new value of 400ms", now == s, now.AttemptTimeout)
	}
	if now.Breakers != s.Breakers || now.Budget != s.Budget || now.Bulkheads != s.Bulkheads || br.State() != breaker.Open {
		t.Error("a reload that left the breaker, budget and bulkhead settings alone replaced them")
	}
	if got := now.Bulkheads.Get("k").InFlight(); got != 1 {
		t.Errorf("in flight after the reload: %d; want 1, the slot taken before it", got)
	}
	reload("bulkhead: {max_concurrent: 16}", "bulkhead: {max_concurrent: 17}")
	if n := h.Current(); n.Bulkheads == s.Bulkheads || n.Breakers != s.Breakers || n.Bulkheads.Get("k").InFlight() != 0 {
		t.Error("new bulkhead settings did not start new compartments, or replaced the breakers")
	}
	reload("consecutive_failures: 4", "consecutive_failures: 5")
	if n := h.Current(); n.Breakers == s.Breakers || n.Budget != s.Budget {
		t.Error("new breaker settings kept the old breakers, or replaced the budget")
	}
	reload("    bulkhead: {max_concurrent: 16}\n", "")
	if n := h.Current(); n.Bulkheads != nil || n.Bulkhead != nil {
		t.Error("a dependency whose bulkhead was removed still has one")
	}
}

// A dependency whose kind changes gets a handle of the new kind; the old
// handle keeps its last settings.
func TestGRPCKindChange(t *testing.T) {
	reg := quietRegistry(t, grpcFile)
	old, _ := reg.HTTPClient("web")
	if err := reg.ReloadBytes([]byte(strings.Replace(grpcFile, "  web:\n", "  web:\n    kind: grpc\n", 1))); err != nil {
		t.Fatal(err)
	}
	h, err := reg.GRPC("web")
	if err != nil || h.Current().MaxAttempts != 1 {
		t.Fatalf("GRPC(web) after it became grpc: %v", err)
	}
	if old.Transport == nil {
		t.Error("the HTTP handle of web went away")
	}
	// Admin actions go to the kind in force, on a breaker that a call made.
	want := h.Current().Breakers.Get("t")
	bs, _, err := reg.breakersOf("web", "t")
	if err != nil || len(bs) != 1 || bs[0] != want {
		t.Error("an admin action on web did not reach its gRPC breakers")
	}
}

func TestGRPCWarnings(t *testing.T) {
	for _, tc := range []struct {
		name, old, new, field, want string
	}{
		{"retries with no idempotent method", "    idempotent_methods: [/inventory.v1.Stock/, /inventory.v1.Reservations/Get]\n", "",
			"defaults.max_attempts", "is 3 but idempotent_methods lists no method"},
		{"a route not listed", "    max_buffered_messages: 8\n", "    max_buffered_messages: 8\n    routes: [{method: /inventory.v1.Reservations/Reserve}]\n",
			"dependencies.inventory.routes[0]", "/inventory.v1.Reservations/Reserve is not in idempotent_methods, yet max_attempts is 3"},
		{"a route listed by its service", "    max_buffered_messages: 8\n", "    max_buffered_messages: 8\n    routes: [{method: /inventory.v1.Stock/Get}, {method: /inventory.v1.Other/Get}]\n",
			"dependencies.inventory.routes[1]", "/inventory.v1.Other/Get is not in idempotent_methods"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parse("policy.yaml", []byte(strings.Replace(grpcFile, tc.old, tc.new, 1)))
			if err != nil {
				t.Fatal(err)
			}
			if len(c.Warnings) != 1 || c.Warnings[0].Field != tc.field || !strings.Contains(c.Warnings[0].Message, tc.want) {
				t.Errorf("warnings %v; want one on %s saying %q", c.Warnings, tc.field, tc.want)
			}
		})
	}
	// A route the code keys, or a dependency that does not retry, is quiet.
	for _, quiet := range []struct{ old, new string }{
		{"    max_buffered_messages: 8\n", "    max_buffered_messages: 8\n    routes: [{method: /inventory.v1.Reservations/Reserve, idempotent: true}]\n"},
		{"    idempotent_methods: [/inventory.v1.Stock/, /inventory.v1.Reservations/Get]\n", "    max_attempts: 1\n"},
	} {
		c, err := parse("policy.yaml", []byte(strings.Replace(grpcFile, quiet.old, quiet.new, 1)))
		if err != nil || len(c.Warnings) != 0 {
			t.Errorf("with %q: %v, warnings %v; want none", quiet.new, err, c.Warnings)
		}
	}
}

// The report lists a gRPC dependency's effective settings, its own keys
// included, and what differs from the defaults.
func TestGRPCReport(t *testing.T) {
	c, err := parse("policy.yaml", []byte(grpcFile))
	if err != nil {
		t.Fatal(err)
	}
	var inv *DependencyReport
	rep := c.report()
	for i := range rep.Dependencies {
		if rep.Dependencies[i].Name == "inventory" {
			inv = &rep.Dependencies[i]
		}
	}
	if inv == nil || inv.Kind != "grpc" || inv.Reason != "tests" {
		t.Fatalf("report of inventory: %+v", inv)
	}
	eff := map[string]string{}
	for _, s := range inv.Effective {
		eff[s.Key] = s.Value
	}
	for k, want := range map[string]string{
		"max_attempts": "3", "attempt_timeout": "300ms", "deadline": "2s", "backoff.strategy": "none",
		"idempotent_methods": "/inventory.v1.Stock/, /inventory.v1.Reservations/Get", "max_buffered_messages": "8",
		"failure_domain": "method", "breaker.consecutive_failures": "4", "breaker.max_keys": "50",
		"breaker.idle_ttl": "10m0s", "bulkhead.max_concurrent": "16", "retry_budget.ratio": "0.5",
	} {
		if eff[k] != want {
			t.Errorf("effective %s = %q; want %q", k, eff[k], want)
		}
	}
	for _, k := range []string{"connect_timeout", "idempotent", "idempotency_keys"} {
		if _, ok := eff[k]; ok {
			t.Errorf("a gRPC dependency's report lists %s, which does not apply to it", k)
		}
	}
	diffs := map[string]Difference{}
	for _, d := range inv.Differences {
		diffs[d.Key] = d
	}
	if d := diffs["failure_domain"]; d.Value != "method" || d.Default != "target" || d.Line != 15 {
		t.Errorf("difference of failure_domain %+v; want method, default target, line 15", d)
	}
	if d := diffs["breaker.consecutive_failures"]; d.Value != "4" || d.Default != "off" {
		t.Errorf("difference of breaker.consecutive_failures %+v; want 4, default off", d)
	}
	if d := diffs["max_buffered_messages"]; d.Value != "8" || d.Default != "64" {
		t.Errorf("difference of max_buffered_messages %+v; want 8, default 64", d)
	}
}

// The admin endpoint lists a gRPC dependency's breakers, by failure
// domain, and its budget, and acts on a breaker by its key.
func TestAdminListsGRPC(t *testing.T) {
	reg := quietRegistry(t, grpcFile)
	h, _ := reg.GRPC("inventory")
	const key = "dns:///inventory:443/inventory.v1.Stock/Get"
	h.Current().Breakers.Get(key)
	admin, err := NewAdmin(reg, AdminConfig{Authorize: func(*http.Request) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(admin)
	defer ts.Close()
	resp, err := http.Post(ts.URL+"/breakers/inventory/open?key="+url.QueryEscape(key)+"&reason=drill", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || h.Current().Breakers.Get(key).State() != breaker.Open {
		t.Fatalf("POST open: %d, breaker %v; want 200, open", resp.StatusCode, h.Current().Breakers.Get(key).State())
	}
	resp, err = http.Get(ts.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st listing
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, b := range st.Breakers {
		if b.Dependency == "inventory" && b.Key == key && b.State == "open" && b.Forced && b.Settings["consecutive_failures"] == float64(4) {
			found = true
		}
	}
	if !found {
		t.Errorf("the listing has no forced-open breaker of inventory under %q: %+v", key, st.Breakers)
	}
	budgets := map[string]budgetState{}
	for _, b := range st.Budgets {
		budgets[b.Dependency] = b
	}
	if b, ok := budgets["inventory"]; !ok || b.Max != 100 || b.Settings["ratio"] != 0.5 {
		t.Errorf("inventory's budget in the listing: %+v", b)
	}
}

// The config module does not bring gRPC into the module graph of a
// program that uses it without gRPC: nothing in it imports gRPC or
// guardgrpc, and its go.mod does not require them.
func TestConfigDoesNotDependOnGRPC(t *testing.T) {
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"google.golang.org/grpc", "guardrail/guardgrpc"} {
		if strings.Contains(string(mod), m) {
			t.Errorf("config's go.mod requires %s", m)
		}
	}
	files, _ := filepath.Glob("*.go")
	if len(files) < 10 {
		t.Fatalf("found %d files; is the test running in the package's directory?", len(files))
	}
	for _, f := range files {
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range af.Imports {
			path, _ := strconv.Unquote(imp.Path.Value)
			if strings.HasPrefix(path, "google.golang.org/") || strings.Contains(path, "/guardgrpc") {
				t.Errorf("%s imports %s", f, path)
			}
		}
	}
}
