package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// checkExample returns the complete example of docs/config.md.
func checkExample(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	s = s[strings.Index(s, "This is a complete file"):]
	s = s[strings.Index(s, "```yaml\n")+len("```yaml\n"):]
	return s[:strings.Index(s, "```")]
}

func runCheckOn(t *testing.T, doc string, flags ...string) (int, string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	code := runCommand(checkCommand, append(flags, path), &stdout, &stderr)
	return code, strings.ReplaceAll(stdout.String(), path, "policy.yaml"), stderr.String()
}

// runCommand runs c as main's run does once the command is registered,
// and returns its exit code.
func runCommand(c command, args []string, stdout, stderr *bytes.Buffer) int {
	err := c.run(context.Background(), args, stdout, stderr)
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.As(err, &ue):
		return exitUsage
	default:
		fmt.Fprintf(stderr, "guardrail %s: %v\n", c.name, err)
		return exitFailed
	}
}

func TestCheckDocumentedExample(t *testing.T) {
	code, out, errs := runCheckOn(t, checkExample(t))
	if code != exitOK {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	for _, want := range []string{
		"payments (http)",
		"differs from the defaults:",
		"attempt_timeout              1.5s (default 800ms; line",
		"reason:   Charges take up to 1.5 s",
		"decision: https://example.com/adr/0042-payments-timeouts",
		"pricing (http)\n  differs from the defaults:\n    hedge.delay                  adaptive, at least 20ms (default hedge off; line",
		"hedge.max_hedges             1 (default hedge off; line",
		"throttle.k                   2 (default throttle off; line",
		"reason:   Prices are reads, safe to send twice.",
		"throttle.window              2m0s (default throttle off; line",
		"ledger (policy)",
		"inventory (grpc)",
		"failure_domain               method (default target; line",
		"idempotent_methods           /inventory.v1.Stock/ (default none; line",
		"reason:   Stock reads answer in 120 ms",
		"owner:    team-inventory",
		"max_buffered_messages        16",
		"no warnings",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
	if code, _, _ := runCheckOn(t, checkExample(t), "--strict"); code != exitOK {
		t.Errorf("--strict on a file without warnings: exit %d; want 0", code)
	}
}

// A dependency that sets nothing is reported as the defaults, hedging and
// throttling off included.
func TestCheckUnchangedDependency(t *testing.T) {
	code, out, errs := runCheckOn(t, "defaults: {max_attempts: 2}\ndependencies:\n  plain: {kind: http}\n  ledger: {kind: policy}\n")
	if code != exitOK {
		t.Fatalf("exit %d; stdout:\n%s\nstderr:\n%s", code, out, errs)
	}
	for _, want := range []string{
		"plain (http)\n  the defaults, unchanged",
		"ledger (policy)\n  the defaults, unchanged",
		"    hedge                        off\n    throttle                     off\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the report lacks %q:\n%s", want, out)
		}
	}
}

// Broken copies of the example exit 1, and each error names its line.
func TestCheckBrokenCopies(t *testing.T) {
	doc := checkExample(t)
	for _, tc := range []struct {
		name, old, new, marker, want string
	}{
		{"no unit", "    attempt_timeout: 1500ms\n", "    attempt_timeout: 5\n", "attempt_timeout: 5", `dependencies.payments.attempt_timeout: "5" has no unit; write 5s`},
		{"no unit, milliseconds", "    attempt_timeout: 1500ms\n", "    attempt_timeout: 700\n", "attempt_timeout: 700", `dependencies.payments.attempt_timeout: "700" has no unit; write 700ms`},
		{"unknown key", "    max_attempts: 2\n", "    max_attemps: 2\n", "max_attemps", "did you mean max_attempts?"},
		{"no reason", "    reason: \"Catalog is", "    owner2: \"Catalog is", "owner2", "dependencies.catalog.owner2: is not a known setting"},
		{"core breaker error", "      min_requests: 50\n", "      min_requests: 0.5\n", "min_requests: 0.5", `dependencies.payments.breaker.min_requests: is "0.5"; want a whole number`},
		{"core deadline error", "      reserve: 20ms", "      reserve: 6s", "reserve: 6s", "servers.api.deadline.reserve: is 6s"},
		{"unknown kind", "  catalog:\n    kind: http", "  catalog:\n    kind: soap", "kind: soap", `dependencies.catalog.kind: is "soap"; want http, grpc or policy`},
		{"http key on grpc", "    max_buffered_messages: 16\n", "    max_buffered_messages: 16\n    idempotency_keys: false\n", "idempotency_keys: false", "dependencies.inventory.idempotency_keys: applies to http dependencies only; this one is kind grpc"},
		{"grpc method name", "[/inventory.v1.Stock/]", "[Stock]", "[Stock]", `dependencies.inventory.idempotent_methods[0]: is "Stock"; want a full method name`},
		{"hedge percentile", "percentile: 0.95 ", "percentile: 1.5 ", "percentile: 1.5", "dependencies.pricing.hedge.percentile: is 1.5; want a value in (0, 1), or zero (guardrail: HedgeConfig.Percentile)"},
		{"throttle k", "      k: 2 ", "      k: 0.5 ", "k: 0.5", "dependencies.pricing.throttle.k: is 0.5; want 1 or more, or zero for the default (2) (throttle: Config.K)"},
		{"grpc hedge window", "hedge: {delay: 150ms}", "hedge: {delay: 150ms, window: 5}", "hedge: {delay: 150ms, window", "dependencies.inventory.hedge.window: is 5; want 20 to 1048576, or zero for the default (1000) (guardrail: HedgeConfig.Window)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if strings.Count(doc, tc.old) != 1 {
				t.Fatalf("%q is not once in the example", tc.old)
			}
			broken := strings.Replace(doc, tc.old, tc.new, 1)
			line := strings.Count(broken[:strings.Index(broken, tc.marker)], "\n") + 1
			code, out, errs := runCheckOn(t, broken)
			if code != exitFailed {
				t.Errorf("exit %d; want %d", code, exitFailed)
			}
			if want := "policy.yaml:" + strconv.Itoa(line) + ": "; !strings.Contains(out, want) || !strings.Contains(out, tc.want) {
				t.Errorf("the report lacks %q and %q:\n%s", want, tc.want, out)
			}
			if !strings.Contains(errs, "error(s)") {
				t.Errorf("stderr %q; want the count of errors", errs)
			}
		})
	}
}

func TestCheckStrictAndJSON(t *testing.T) {
	risky := strings.Replace(checkExample(t), "      min_requests: 50\n", "      min_requests: 1\n", 1)
	if code, out, _ := runCheckOn(t, risky); code != exitOK || !strings.Contains(out, "1 warning(s)") || !strings.Contains(out, "one early failure opens the breaker") {
		t.Errorf("a warning without --strict: exit %d, report:\n%s", code, out)
	}
	if code, _, _ := runCheckOn(t, risky, "--strict"); code != exitFailed {
		t.Errorf("a warning with --strict: exit %d; want %d", code, exitFailed)
	}
	code, out, _ := runCheckOn(t, strings.Replace(risky, "max_attempts: 2\n", "max_attempts: -2\n", 1), "--json")
	if code != exitFailed {
		t.Errorf("--json on a broken file: exit %d; want %d", code, exitFailed)
	}
	var rep struct {
		OK     bool
		Errors []struct {
			Line           int
			Field, Message string
		}
		Warnings []struct {
			Line  int
			Field string
		}
		Dependencies []struct {
			Name, Kind, Reason string
			Effective          []struct{ Key, Value string }
		}
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("--json wrote no JSON: %v\n%s", err, out)
	}
	if rep.OK || len(rep.Errors) != 1 || rep.Errors[0].Field != "dependencies.payments.max_attempts" || rep.Errors[0].Line == 0 || len(rep.Warnings) != 1 || len(rep.Dependencies) != 5 {
		t.Errorf("JSON report %+v", rep)
	}
	// The gRPC dependency is in it, with its reason and its own settings.
	found := false
	for _, d := range rep.Dependencies {
		if d.Name != "inventory" {
			continue
		}
		eff := map[string]string{}
		for _, e := range d.Effective {
			eff[e.Key] = e.Value
		}
		found = d.Kind == "grpc" && strings.HasPrefix(d.Reason, "Stock reads") && eff["failure_domain"] == "method" &&
			eff["idempotent_methods"] == "/inventory.v1.Stock/" && eff["attempt_timeout"] == "250ms" && eff["breaker.consecutive_failures"] == "5"
	}
	if !found {
		t.Errorf("the JSON report lacks inventory as a grpc dependency with its settings:\n%s", out)
	}
	// The hedged and throttled dependency is in it with the effective
	// settings, defaults filled in, and what differs from the defaults.
	for _, d := range rep.Dependencies {
		if d.Name != "pricing" {
			continue
		}
		eff := map[string]string{}
		for _, e := range d.Effective {
			eff[e.Key] = e.Value
		}
		for k, want := range map[string]string{"hedge.delay": "adaptive, at least 20ms", "hedge.percentile": "0.95", "hedge.window": "1000",
			"hedge.max_hedges": "1", "hedge.overload_pause": "10s", "throttle.window": "2m0s", "throttle.k": "2"} {
			if eff[k] != want {
				t.Errorf("pricing's %s is %q in the JSON report; want %q", k, eff[k], want)
			}
		}
		if !strings.Contains(d.Reason, "hedge after the p95") {
			t.Errorf("pricing's reason %q", d.Reason)
		}
	}
}

func TestCheckUsage(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := runCommand(checkCommand, nil, &stdout, &stderr); code != exitUsage {
		t.Errorf("check without a file: exit %d; want %d", code, exitUsage)
	}
}
