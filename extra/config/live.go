package config

import (
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
)

// liveBreaker is a breaker in use, with the dependency and key it is
// listed under.
type liveBreaker struct {
	dep, key string
	b        *breaker.Breaker
}

// liveBudget is a retry budget in use, with its dependency.
type liveBudget struct {
	dep string
	b   *budget.Budget
}

// inForce reports whether the handle of kind for dependency name is the
// one the file in force describes: a dependency whose kind changed keeps
// its old handle, whose values no longer carry its new calls.
func (c *checkedFile) inForce(name, kind string) bool {
	d := c.dependency(name)
	return d == nil || d.Kind == kind // a removed dependency's handle still runs
}

// live returns the breakers and budgets the handles' values in force use
// now, in dependency order.
func (r *Registry) live(breakers, budgets bool) ([]liveBreaker, []liveBudget) {
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.checked.Load()
	var bs []liveBreaker
	var gs []liveBudget
	group := func(dep string, g *breaker.Group) {
		if breakers && g != nil {
			g.Range(func(key string, b *breaker.Breaker) bool {
				bs = append(bs, liveBreaker{dep, key, b})
				return true
			})
		}
	}
	for _, name := range sortedKeys(r.https) {
		if !c.inForce(name, kindHTTP) {
			continue
		}
		cfg := &r.https[name].cur.Load().cfg
		group(name, cfg.Breakers)
		if budgets {
			gs = append(gs, liveBudget{name, cfg.Budget})
		}
	}
	for _, name := range sortedKeys(r.grpcs) {
		if !c.inForce(name, kindGRPC) {
			continue
		}
		g := r.grpcs[name].Current()
		group(name, g.Breakers)
		if budgets {
			gs = append(gs, liveBudget{name, g.Budget})
		}
	}
	for _, name := range sortedKeys(r.policies) {
		if !c.inForce(name, kindPolicy) {
			continue
		}
		p := r.policies[name].Policy()
		if breakers && p.Breaker != nil {
			bs = append(bs, liveBreaker{name, "", p.Breaker})
		}
		if budgets {
			gs = append(gs, liveBudget{name, p.BudgetInUse()})
		}
	}
	return bs, gs
}

// RangeBreakers calls yield for every breaker the values in force use now,
// until it returns false: an HTTP dependency's breaker of each host, a
// gRPC dependency's of each failure domain, under the key its calls are
// counted by, and a policy dependency's one breaker, under an empty key;
// all of them under the dependency's name. A breaker of a group exists
// from the first call to its key, so before any call an HTTP or gRPC
// dependency has none. A reload that changes a dependency's breaker
// settings or its kind replaces its breakers with the new ones. Metrics
// adapters read it at every scrape (extra/prom's Collector.WatchSource),
// so every breaker is exported with its real key before its first
// transition. yield runs without any lock of the Registry held.
func (r *Registry) RangeBreakers(yield func(dependency, key string, b *breaker.Breaker) bool) {
	bs, _ := r.live(true, false)
	for _, b := range bs {
		if !yield(b.dep, b.key, b.b) {
			return
		}
	}
}

// RangeBudgets calls yield for the retry budget of every dependency of
// the values in force now, until it returns false, as RangeBreakers does
// for breakers. Every dependency has one from the start (an unlimited one
// when the file sets none, whose Tokens are +Inf); a reload that changes
// its retry_budget replaces it.
func (r *Registry) RangeBudgets(yield func(dependency string, b *budget.Budget) bool) {
	_, gs := r.live(false, true)
	for _, g := range gs {
		if !yield(g.dep, g.b) {
			return
		}
	}
}
