package prom_test

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/prom"
)

// fileSource holds what a policy file's registry holds: per dependency a
// breaker group (HTTP, gRPC) or one breaker (policy), and a budget; reload
// replaces a dependency's values as a reload that changes its settings
// does.
type fileSource struct {
	mu       sync.Mutex
	groups   map[string]*breaker.Group
	breakers map[string]*breaker.Breaker
	budgets  map[string]*budget.Budget
}

func (s *fileSource) RangeBreakers(yield func(dependency, key string, b *breaker.Breaker) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for dep, g := range s.groups {
		g.Range(func(key string, b *breaker.Breaker) bool { return yield(dep, key, b) })
	}
	for dep, b := range s.breakers {
		if !yield(dep, "", b) {
			return
		}
	}
}

func (s *fileSource) RangeBudgets(yield func(dependency string, b *budget.Budget) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for dep, b := range s.budgets {
		if !yield(dep, b) {
			return
		}
	}
}

func (s *fileSource) reload(dep string, g *breaker.Group, b *budget.Budget) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups[dep], s.budgets[dep] = g, b
}

// Every breaker and budget of a Source is exported from the first scrape,
// before any call or event, with its dependency and real key; a
// dependency's transition events (which carry no key) add no series; what
// a reload replaced disappears.
func TestWatchSource(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := newCollector(t, prom.Config{})
	reg.MustRegister(c)
	paymentsBudget := must(budget.New(budget.Config{Ratio: 0.5, Max: 7}))
	ledger := must(breaker.New(breaker.Config{Name: "ledger"}))
	src := &fileSource{
		groups:   map[string]*breaker.Group{"payments": must(breaker.NewGroup(breaker.GroupConfig{})), "inventory": must(breaker.NewGroup(breaker.GroupConfig{}))},
		breakers: map[string]*breaker.Breaker{"ledger": ledger},
		budgets:  map[string]*budget.Budget{"payments": paymentsBudget, "inventory": budget.Unlimited(), "ledger": must(budget.New(budget.Config{}))},
	}
	c.WatchSource(src)
	c.WatchSource(src) // counted once
	// The policy handle's policy, watched as well: still one breaker.
	c.WatchPolicy(&guardrail.Policy{Name: "ledger", Breaker: ledger})

	// The first scrape, before any call.
	diff(t, only(samples(t, reg), "guardrail_breaker_state", "guardrail_retry_budget_tokens"), map[string]float64{
		`guardrail_breaker_state{dependency="ledger",key="",state="closed"}`:    1,
		`guardrail_breaker_state{dependency="ledger",key="",state="open"}`:      0,
		`guardrail_breaker_state{dependency="ledger",key="",state="half_open"}`: 0,
		`guardrail_retry_budget_tokens{dependency="payments"}`:                  7,
		`guardrail_retry_budget_tokens{dependency="inventory"}`:                 math.Inf(1),
		`guardrail_retry_budget_tokens{dependency="ledger"}`:                    budget.DefaultMax,
	})

	// The first call to a host makes its breaker: it is exported under its
	// key at once, closed. A transition event of payments, as a transport
	// reports it (no key), and a refusal's token count add nothing.
	src.groups["payments"].Get("pay.example:443")
	src.groups["inventory"].Get("dns:///inventory:443/inventory.v1.Stock/Get").ForceOpen()
	ctx := context.Background()
	c.Observe(ctx, event.Event{Kind: event.BreakerTransition, Dependency: "inventory", From: "closed", To: "open", Reason: "forced_open"})
	c.Observe(ctx, event.Event{Kind: event.BudgetExhausted, Dependency: "payments", Tokens: 0.25})
	diff(t, only(samples(t, reg), "guardrail_breaker_state", "guardrail_retry_budget_tokens"), map[string]float64{
		`guardrail_breaker_state{dependency="ledger",key="",state="closed"}`:                                                  1,
		`guardrail_breaker_state{dependency="ledger",key="",state="open"}`:                                                    0,
		`guardrail_breaker_state{dependency="ledger",key="",state="half_open"}`:                                               0,
		`guardrail_breaker_state{dependency="payments",key="pay.example:443",state="closed"}`:                                 1,
		`guardrail_breaker_state{dependency="payments",key="pay.example:443",state="open"}`:                                   0,
		`guardrail_breaker_state{dependency="payments",key="pay.example:443",state="half_open"}`:                              0,
		`guardrail_breaker_state{dependency="inventory",key="dns:///inventory:443/inventory.v1.Stock/Get",state="closed"}`:    0,
		`guardrail_breaker_state{dependency="inventory",key="dns:///inventory:443/inventory.v1.Stock/Get",state="open"}`:      1,
		`guardrail_breaker_state{dependency="inventory",key="dns:///inventory:443/inventory.v1.Stock/Get",state="half_open"}`: 0,
		`guardrail_retry_budget_tokens{dependency="payments"}`:                                                                7,
		`guardrail_retry_budget_tokens{dependency="inventory"}`:                                                               math.Inf(1),
		`guardrail_retry_budget_tokens{dependency="ledger"}`:                                                                  budget.DefaultMax,
	})

	// A reload gives payments a new group, which no call has used, and a
	// new budget: the old ones are gone from the next scrape, and the
	// event-made state of inventory still adds nothing.
	old := src.groups["payments"]
	src.reload("payments", must(breaker.NewGroup(breaker.GroupConfig{})), must(budget.New(budget.Config{Max: 3})))
	old.Get("pay.example:443").ForceOpen()
	diff(t, only(samples(t, reg), "guardrail_breaker_state", "guardrail_retry_budget_tokens"), map[string]float64{
		`guardrail_breaker_state{dependency="ledger",key="",state="closed"}`:                                                  1,
		`guardrail_breaker_state{dependency="ledger",key="",state="open"}`:                                                    0,
		`guardrail_breaker_state{dependency="ledger",key="",state="half_open"}`:                                               0,
		`guardrail_breaker_state{dependency="inventory",key="dns:///inventory:443/inventory.v1.Stock/Get",state="closed"}`:    0,
		`guardrail_breaker_state{dependency="inventory",key="dns:///inventory:443/inventory.v1.Stock/Get",state="open"}`:      1,
		`guardrail_breaker_state{dependency="inventory",key="dns:///inventory:443/inventory.v1.Stock/Get",state="half_open"}`: 0,
		`guardrail_retry_budget_tokens{dependency="payments"}`:                                                                3,
		`guardrail_retry_budget_tokens{dependency="inventory"}`:                                                               math.Inf(1),
		`guardrail_retry_budget_tokens{dependency="ledger"}`:                                                                  budget.DefaultMax,
	})
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Errorf("lint: %v %v", problems, err)
	}
}
