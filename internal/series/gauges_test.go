package series

import (
	"fmt"
	"maps"
	"math"
	"slices"
	"testing"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/budget"
)

func collect(g *Gauges) map[string]float64 {
	out := make(map[string]float64)
	g.Collect(
		func(dep, key, state string, n float64) { out["state/"+dep+"/"+key+"/"+state] = n },
		func(dep string, n float64) { out["tokens/"+dep] = n },
		func(dep string, in, lim float64) { out["load/"+dep] = in; out["limit/"+dep] = lim },
	)
	return out
}

func TestGauges(t *testing.T) {
	g := NewGauges(NewFolders(3))
	g.WatchBreakerState("a", func() string { return "open" }, nil)
	// A group of breakers keyed by host, each host its own dependency (no
	// name): more keys than the cap.
	g.WatchStates("", func(report func(key, state string)) {
		for i := range 5 {
			state := "closed"
			if i%2 == 0 {
				state = "half_open"
			}
			report(fmt.Sprintf("h%d", i), state)
		}
	}, nil)
	// Events: a watched dependency ignores them, another is exported.
	g.Observe(&event.Event{Kind: event.BreakerTransition, Dependency: "a", To: "closed"})
	g.WatchBudget("a", must(budget.New(budget.Config{Max: 4})))
	g.WatchBudget("a", budget.Unlimited())
	g.Observe(&event.Event{Kind: event.BudgetExhausted, Dependency: "b", Tokens: 0.25})
	g.Observe(&event.Event{Kind: event.Shed, Dependency: "b", InFlight: 9, Limit: 10})

	got := collect(g)
	want := map[string]float64{
		// "a", "b" and "h0" keep their names (cap 3); h1..h4 fold to other.
		"state/a//closed": 0, "state/a//open": 1, "state/a//half_open": 0,
		"state/h0//closed": 0, "state/h0//open": 0, "state/h0//half_open": 1,
		"state/other//closed": 2, "state/other//open": 0, "state/other//half_open": 2,
		"tokens/a": math.Inf(1), "tokens/b": 0.25,
		"load/b": 9, "limit/b": 10,
	}
	if !maps.Equal(got, want) {
		keys := slices.Sorted(maps.Keys(got))
		for _, k := range keys {
			if got[k] != want[k] {
				t.Errorf("%s = %v, want %v", k, got[k], want[k])
			}
		}
		for k := range want {
			if _, ok := got[k]; !ok {
				t.Errorf("missing %s", k)
			}
		}
	}
}

// TestWatchTwice: the same component watched twice under one dependency
// counts once; two functions count twice (they cannot be told apart).
func TestWatchTwice(t *testing.T) {
	g := NewGauges(NewFolders(0))
	b := must(budget.New(budget.Config{Max: 3}))
	g.WatchBudget("x", b)
	g.WatchBudget("x", b)
	id := new(int)
	g.WatchBreakerState("x", func() string { return "open" }, id)
	g.WatchBreakerState("x", func() string { return "open" }, id)
	g.WatchLoad("x", func() (int, int) { return 1, 2 }, nil)
	g.WatchLoad("x", func() (int, int) { return 1, 2 }, nil)
	got := collect(g)
	if got["tokens/x"] != 3 || got["state/x//open"] != 1 || got["load/x"] != 2 {
		t.Errorf("tokens %v (want 3), open %v (want 1), in flight %v (want 2)", got["tokens/x"], got["state/x//open"], got["load/x"])
	}
}

// TestGroupUnderName: a group that splits one named dependency exports its
// breakers under that name with their keys, and the transition events of
// the same name (which carry no key) add no second series for them.
func TestGroupUnderName(t *testing.T) {
	g := NewGauges(NewFolders(2))
	g.WatchStates("users", func(report func(key, state string)) {
		report("a:443", "open")
		report("b:443", "closed")
		report("c:443", "closed") // past the cap of 2 keys
	}, nil)
	g.Observe(&event.Event{Kind: event.BreakerTransition, Dependency: "users", From: "closed", To: "open"})
	got := collect(g)
	want := map[string]float64{
		"state/users/a:443/closed": 0, "state/users/a:443/open": 1, "state/users/a:443/half_open": 0,
		"state/users/b:443/closed": 1, "state/users/b:443/open": 0, "state/users/b:443/half_open": 0,
		"state/users/other/closed": 1, "state/users/other/open": 0, "state/users/other/half_open": 0,
	}
	if !maps.Equal(got, want) {
		t.Errorf("got %v\nwant %v", got, want)
	}
}

// must returns v, for constructors given a configuration the test knows is
// valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
