package series

import (
	"math"
	"reflect"
	"sync"
	"sync/atomic"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/shed"
)

// Gauges holds the state that events report only when it changes (breaker
// state, retry budget tokens, shedder load) so that an adapter can export
// it at collection time. Watched components are read at collection time
// and win over what events last said about the same dependency; several
// watched components under one dependency value (a group, or values folded
// to Other) add up. Gauges is safe for concurrent use.
type Gauges struct {
	dep, key, state *Folder

	states *Cache[*stateGauge]
	tokens *Cache[*floatGauge]
	loads  *Cache[*loadGauge]

	mu       sync.Mutex // guards the watch lists and watched
	wStates  []stateWatch
	wBudgets []budgetWatch
	wLoads   []loadWatch
	sources  []Source
	watched  map[watchKey]bool
}

// Source is a set of breakers and retry budgets that changes while the
// program runs (a policy file's registry, whose reloads replace them),
// read at every collection: RangeBreakers yields each breaker in use with
// the dependency its calls name and its key (empty for a dependency's
// only breaker), RangeBudgets each dependency's retry budget, until yield
// returns false. The adapters export it as their own Source type.
type Source interface {
	RangeBreakers(yield func(dependency, key string, b *breaker.Breaker) bool)
	RangeBudgets(yield func(dependency string, b *budget.Budget) bool)
}

// WatchSource reads s at every collection. A dependency s reports takes
// its breaker states and budget tokens from s alone, not from events or
// the other watches, so that one breaker is one set of series and what a
// reload replaced disappears. Watching s again is a no-op.
func (g *Gauges) WatchSource(s Source) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if reflect.TypeOf(s).Comparable() {
		for _, o := range g.sources {
			if reflect.TypeOf(o).Comparable() && o == s {
				return
			}
		}
	}
	g.sources = append(g.sources, s)
}

type stateGauge struct{ state atomic.Pointer[string] }

type floatGauge struct{ bits atomic.Uint64 }

type loadGauge struct{ inFlight, limit atomic.Int64 }

// stateWatch reports breaker states at collection time: either the one
// breaker of dep, or (each != nil) a changing set of breakers (a group),
// each under dep with its own key, or under its key as the dependency when
// dep is empty.
type stateWatch struct {
	dep   string
	state func() string
	each  func(report func(key, state string))
}

type budgetWatch struct {
	dep string
	b   *budget.Budget
}

type loadWatch struct {
	dep  string
	load func() (inFlight, limit int)
}

// byDependency keys the gauges' caches: the value an event last reported,
// by dependency alone.
var byDependency = &Def{Name: "by_dependency", Labels: []string{LDependency}}

// NewGauges returns empty Gauges whose labels are folded by fs.
func NewGauges(fs *Folders) *Gauges {
	return &Gauges{
		dep:    fs.For(LDependency),
		key:    fs.For(LKey),
		state:  fs.For(LState),
		states: NewCache(byDependency, fs, func([]string) *stateGauge { return new(stateGauge) }),
		tokens: NewCache(byDependency, fs, func([]string) *floatGauge { return new(floatGauge) }),
		loads:  NewCache(byDependency, fs, func([]string) *loadGauge { return new(loadGauge) }),
	}
}

// Observe records what e says about a gauge, if anything.
func (g *Gauges) Observe(e *event.Event) {
	switch e.Kind {
	case event.BreakerTransition:
		to := g.state.Fold(e.To)
		g.states.Get(e.Dependency, "", "", "").state.Store(&to)
	case event.BudgetExhausted:
		g.tokens.Get(e.Dependency, "", "", "").bits.Store(math.Float64bits(e.Tokens))
	case event.Shed, event.Admit:
		l := g.loads.Get(e.Dependency, "", "", "")
		l.inFlight.Store(int64(e.InFlight))
		l.limit.Store(int64(e.Limit))
	}
}

// WatchBreakerState adds a breaker of dependency whose state (a
// breaker.State's String) is read at collection time. A non-nil id (the
// breaker) makes watching the same one again under the same dependency a
// no-op; the other Watch methods take one too.
func (g *Gauges) WatchBreakerState(dependency string, state func() string, id any) {
	w := stateWatch{dep: g.dep.Fold(dependency), state: state}
	g.mu.Lock()
	if g.first(watchKey{'s', w.dep, id}) {
		g.wStates = append(g.wStates, w)
	}
	g.mu.Unlock()
}

// watchKey identifies a watched component, so that watching it twice (a
// policy's breaker through the policy and on its own) does not count it
// twice.
type watchKey struct {
	kind byte
	dep  string
	id   any // the component; nil for a function, which is never deduplicated
}

// first reports whether k was not watched yet, and notes it; the caller
// holds g.mu.
func (g *Gauges) first(k watchKey) bool {
	if k.id == nil {
		return true
	}
	if g.watched == nil {
		g.watched = make(map[watchKey]bool)
	}
	if g.watched[k] {
		return false
	}
	g.watched[k] = true
	return true
}

// WatchBudget adds a retry budget of dependency read at collection time.
func (g *Gauges) WatchBudget(dependency string, b *budget.Budget) {
	w := budgetWatch{dep: g.dep.Fold(dependency), b: b}
	g.mu.Lock()
	if g.first(watchKey{'b', w.dep, b}) {
		g.wBudgets = append(g.wBudgets, w)
	}
	g.mu.Unlock()
}

// WatchLoad adds a load shedder of dependency read at collection time.
func (g *Gauges) WatchLoad(dependency string, load func() (inFlight, limit int), id any) {
	w := loadWatch{dep: g.dep.Fold(dependency), load: load}
	g.mu.Lock()
	if g.first(watchKey{'l', w.dep, id}) {
		g.wLoads = append(g.wLoads, w)
	}
	g.mu.Unlock()
}

// WatchStates adds a changing set of breakers (a keyed group) of
// dependency: at collection time each calls report once per breaker with
// its key and state. Each breaker is exported under dependency with its key
// as the key label; when dependency is empty, each key is a dependency of
// its own (as an HTTP client without a name labels its calls) and the key
// label is empty.
func (g *Gauges) WatchStates(dependency string, each func(report func(key, state string)), id any) {
	w := stateWatch{each: each}
	if dependency != "" {
		w.dep = g.dep.Fold(dependency)
	}
	g.mu.Lock()
	if g.first(watchKey{'g', w.dep, id}) {
		g.wStates = append(g.wStates, w)
	}
	g.mu.Unlock()
}

func (g *Gauges) watches() ([]stateWatch, []budgetWatch, []loadWatch, []Source) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.wStates[:len(g.wStates):len(g.wStates)],
		g.wBudgets[:len(g.wBudgets):len(g.wBudgets)],
		g.wLoads[:len(g.wLoads):len(g.wLoads)],
		g.sources[:len(g.sources):len(g.sources)]
}

// Collect reports every gauge value: for each dependency and key with a
// known breaker, the number of its breakers in each of States (and in any
// other state seen); the tokens of each dependency's budgets; the in-flight
// count and limit of each dependency's shedders. Watched components are
// called without any lock held. A dependency with a watched breaker takes
// no state from events: they name no key, and would export the same
// breaker a second time.
func (g *Gauges) Collect(state func(dep, key, state string, n float64), tokens func(dep string, n float64), load func(dep string, inFlight, limit float64)) {
	ws, wb, wl, srcs := g.watches()

	type depKey struct{ dep, key string }
	type depState struct {
		depKey
		state string
	}
	counts := make(map[depState]float64)
	known := make(map[depKey]bool)
	watched := make(map[string]bool) // dependencies with a watched breaker
	add := func(dep, key, state string) {
		dk := depKey{dep, key}
		known[dk] = true
		watched[dep] = true
		counts[depState{dk, g.state.Fold(state)}]++
	}
	// What the sources hold wins: a dependency they report takes nothing
	// from the watches or from events.
	fromSource := make(map[string]bool)
	toks := make(map[string]float64)
	for _, s := range srcs {
		s.RangeBreakers(func(dep, key string, b *breaker.Breaker) bool {
			dep = g.dep.Fold(dep)
			fromSource[dep] = true
			add(dep, g.key.Fold(key), b.State().String())
			return true
		})
		s.RangeBudgets(func(dep string, b *budget.Budget) bool {
			dep = g.dep.Fold(dep)
			fromSource[dep] = true
			toks[dep] += b.Tokens()
			return true
		})
	}
	for _, w := range ws {
		if fromSource[w.dep] {
			continue
		}
		switch {
		case w.each == nil:
			add(w.dep, "", w.state())
		case w.dep == "":
			w.each(func(key, state string) {
				if dep := g.dep.Fold(key); !fromSource[dep] {
					add(dep, "", state)
				}
			})
		default:
			w.each(func(key, state string) { add(w.dep, g.key.Fold(key), state) })
		}
	}
	g.states.Range(func(lv []string, sg *stateGauge) {
		s := sg.state.Load()
		if s == nil || watched[lv[0]] {
			return
		}
		dk := depKey{lv[0], ""}
		known[dk] = true
		counts[depState{dk, *s}]++
	})
	for dk := range known {
		for _, s := range States {
			k := depState{dk, s}
			state(dk.dep, dk.key, s, counts[k])
			delete(counts, k)
		}
	}
	for k, n := range counts { // states other than the three known ones
		state(k.dep, k.key, k.state, n)
	}

	for _, w := range wb {
		if !fromSource[w.dep] {
			toks[w.dep] += w.b.Tokens()
		}
	}
	g.tokens.Range(func(lv []string, fg *floatGauge) {
		if _, ok := toks[lv[0]]; !ok && !fromSource[lv[0]] {
			toks[lv[0]] = math.Float64frombits(fg.bits.Load())
		}
	})
	for dep, n := range toks {
		tokens(dep, n)
	}

	type inLim struct{ in, lim float64 }
	loads := make(map[string]inLim)
	for _, w := range wl {
		in, lim := w.load()
		l := loads[w.dep]
		loads[w.dep] = inLim{l.in + float64(in), l.lim + float64(lim)}
	}
	g.loads.Range(func(lv []string, lg *loadGauge) {
		if _, ok := loads[lv[0]]; !ok {
			loads[lv[0]] = inLim{float64(lg.inFlight.Load()), float64(lg.limit.Load())}
		}
	})
	for dep, l := range loads {
		load(dep, l.in, l.lim)
	}
}

// WatchBreaker watches b's state under dependency.
func (g *Gauges) WatchBreaker(dependency string, b *breaker.Breaker) {
	g.WatchBreakerState(dependency, func() string { return b.State().String() }, b)
}

// WatchBreakerGroup watches every breaker grp holds, under dependency with
// its key as the key label (see WatchStates).
func (g *Gauges) WatchBreakerGroup(dependency string, grp *breaker.Group) {
	g.WatchStates(dependency, func(report func(key, state string)) {
		grp.Range(func(key string, b *breaker.Breaker) bool {
			report(key, b.State().String())
			return true
		})
	}, grp)
}

// WatchPolicy watches p's retry budget and breaker under p.Name.
func (g *Gauges) WatchPolicy(p *guardrail.Policy) {
	g.WatchBudget(p.Name, p.BudgetInUse())
	if b := p.BreakerInUse(); b != nil {
		g.WatchBreaker(p.Name, b)
	}
}

// WatchShedder watches s's in-flight count and limit under dependency.
func (g *Gauges) WatchShedder(dependency string, s *shed.Shedder) {
	g.WatchLoad(dependency, s.Load, s)
}
