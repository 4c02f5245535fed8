package config

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
)

// liveOf returns what RangeBreakers and RangeBudgets report, as
// "dependency key" strings and tokens by dependency.
func liveOf(reg *Registry) ([]string, map[string]float64, map[string]*budget.Budget) {
	var bs []string
	reg.RangeBreakers(func(dep, key string, b *breaker.Breaker) bool {
		bs = append(bs, dep+" "+key+" "+b.State().String())
		return true
	})
	toks, budgets := map[string]float64{}, map[string]*budget.Budget{}
	reg.RangeBudgets(func(dep string, b *budget.Budget) bool {
		toks[dep], budgets[dep] = b.Tokens(), b
		return true
	})
	slices.Sort(bs)
	return bs, toks, budgets
}

// A registry reports the breakers and budgets of the values in force:
// every budget and a policy's breaker from the start, a host's breaker
// from its first call with the host as key, and after a reload the new
// values, of the kind in force.
func TestRangeBreakersAndBudgets(t *testing.T) {
	reg := quietRegistry(t, testFile)
	bs, toks, budgets := liveOf(reg)
	if want := []string{"ledger  closed"}; !slices.Equal(bs, want) {
		t.Errorf("breakers before any call: %q; want %q", bs, want)
	}
	if len(toks) != 3 || toks["svc"] != 100 || toks["other"] != 100 || toks["ledger"] != 100 {
		t.Errorf("budgets before any call: %v; want svc, other and ledger with 100 tokens", toks)
	}
	ts := newServer(t, &counting{})
	client, _ := reg.HTTPClient("svc")
	if code, err := get(t, client, ts.URL); err != nil || code != 200 {
		t.Fatal(code, err)
	}
	host := strings.TrimPrefix(ts.URL, "http://")
	bs, _, _ = liveOf(reg)
	if want := []string{"ledger  closed", "svc " + host + " closed"}; !slices.Equal(bs, want) {
		t.Errorf("breakers after a call: %q; want %q", bs, want)
	}

	// New breaker and budget settings for svc: a new group, no call yet,
	// and a new budget.
	file := strings.Replace(testFile, "failure_rate: 0.9}", "failure_rate: 0.8}", 1)
	file = strings.Replace(file, "  svc:\n", "  svc:\n    retry_budget: {max: 7}\n", 1)
	if err := reg.ReloadBytes([]byte(file)); err != nil {
		t.Fatal(err)
	}
	bs, toks, after := liveOf(reg)
	if want := []string{"ledger  closed"}; !slices.Equal(bs, want) {
		t.Errorf("breakers after a reload of svc's breaker settings: %q; want %q", bs, want)
	}
	if toks["svc"] != 7 || after["svc"] == budgets["svc"] || after["ledger"] != budgets["ledger"] {
		t.Errorf("budgets after the reload: %v; want svc's new one with 7 tokens, ledger's kept", toks)
	}

	// svc becomes a policy dependency, with no retry budget: its breaker
	// and its unlimited budget are the policy's; the HTTP handle's are not
	// reported.
	file = strings.Replace(testFile, "  svc:\n", "  svc:\n    kind: policy\n    retry_budget: {unlimited: true}\n", 1)
	file = strings.Replace(file, "    response_header_timeout: 1s\n", "", 1)
	if err := reg.ReloadBytes([]byte(file)); err != nil {
		t.Fatal(err)
	}
	bs, toks, _ = liveOf(reg)
	if want := []string{"ledger  closed", "svc  closed"}; !slices.Equal(bs, want) {
		t.Errorf("breakers after svc became a policy: %q; want %q", bs, want)
	}
	if len(toks) != 3 {
		t.Errorf("budgets after svc became a policy: %v; want one per dependency", toks)
	}
	p, _ := reg.Policy("svc")
	if got := p.Policy().BudgetInUse().Tokens(); toks["svc"] != got || !math.IsInf(got, 1) {
		t.Errorf("svc's budget tokens %v; want the policy's unlimited one, %v", toks["svc"], got)
	}
}
