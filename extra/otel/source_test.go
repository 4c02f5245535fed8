package otel_test

import (
	"testing"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
)

// source is a fixed Source: two breakers of one dependency, by host, and
// a budget.
type source struct {
	a, b *breaker.Breaker
	bud  *budget.Budget
}

func (s source) RangeBreakers(yield func(dependency, key string, b *breaker.Breaker) bool) {
	_ = yield("users", "10.0.0.1:443", s.a) && yield("users", "10.0.0.2:443", s.b)
}

func (s source) RangeBudgets(yield func(dependency string, b *budget.Budget) bool) {
	yield("users", s.bud)
}

// A watched Source is reported from the first collection, before any
// call or transition, each breaker with its key, and what it holds wins
// over what events said of the same dependency.
func TestWatchSource(t *testing.T) {
	f := newFixture(t, 0)
	a, err := breaker.New(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := breaker.New(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b.ForceOpen()
	bud, err := budget.New(budget.Config{Max: 7})
	if err != nil {
		t.Fatal(err)
	}
	src := source{a, b, bud}
	f.obs.WatchSource(src)
	f.obs.WatchSource(src) // again: a no-op
	got := collect(t, f.reader)
	for k, want := range map[string]float64{
		"guardrail.breaker.state{dependency=users,key=10.0.0.1:443,state=closed}": 1,
		"guardrail.breaker.state{dependency=users,key=10.0.0.1:443,state=open}":   0,
		"guardrail.breaker.state{dependency=users,key=10.0.0.2:443,state=open}":   1,
		"guardrail.breaker.state{dependency=users,key=10.0.0.2:443,state=closed}": 0,
		"guardrail.retry_budget.tokens{dependency=users}":                         7,
	} {
		if v, ok := got[k]; !ok || v != want {
			t.Errorf("%s = %v (present %v), want %v", k, v, ok, want)
		}
	}
	for k := range got {
		if k == "guardrail.breaker.state{dependency=users,state=closed}" {
			t.Errorf("%s: a breaker without its key", k)
		}
	}
}
