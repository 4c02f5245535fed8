package prom_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/extra/prom"
	"github.com/guardrail-go/guardrail/shed"
)

// sample names one exported value: counters and gauges by name and labels,
// histograms as name_count and name_sum.
func samples(t *testing.T, g prometheus.Gatherer) map[string]float64 {
	t.Helper()
	families, err := g.Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	out := make(map[string]float64)
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			id := "{" + strings.Join(labels, ",") + "}"
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				out[f.GetName()+id] = m.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				out[f.GetName()+id] = m.GetGauge().GetValue()
			case dto.MetricType_HISTOGRAM:
				out[f.GetName()+"_count"+id] = float64(m.GetHistogram().GetSampleCount())
				out[f.GetName()+"_sum"+id] = m.GetHistogram().GetSampleSum()
			}
		}
	}
	return out
}

// only keeps the samples whose name starts with one of prefixes.
func only(all map[string]float64, prefixes ...string) map[string]float64 {
	out := make(map[string]float64)
	for k, v := range all {
		for _, p := range prefixes {
			if strings.HasPrefix(k, p+"{") {
				out[k] = v
			}
		}
	}
	return out
}

func diff(t *testing.T, got, want map[string]float64) {
	t.Helper()
	keys := slices.Sorted(maps.Keys(want))
	for k := range got {
		if _, ok := want[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		g, gok := got[k]
		w, wok := want[k]
		switch {
		case !gok:
			t.Errorf("missing %s (want %v)", k, w)
		case !wok:
			t.Errorf("unexpected %s = %v", k, g)
		case g != w:
			t.Errorf("%s = %v, want %v", k, g, w)
		}
	}
}

var errUnavailable = errors.New("503 service unavailable")

// TestWorkload runs a small guarded workload with failures, retries, budget
// exhaustion, attempt exhaustion and timeouts, inside a synctest bubble so
// that durations are exact, and checks every counter it should move.
func TestWorkload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		c := newCollector(t, prom.Config{ConstLabels: prometheus.Labels{"region": "eu"}})
		reg.MustRegister(c)

		inventory := &guardrail.Policy{
			Name: "inventory", Idempotent: true, Retry: guardrail.Retry{
				Backoff: backoff.Constant(100 * time.Millisecond),
				Budget:  must(budget.New(budget.Config{Ratio: 0.1, Max: 2})),
			},
			Observer: c,
		}
		search := &guardrail.Policy{
			Name: "search", Idempotent: true, Retry: guardrail.Retry{
				Backoff: backoff.None(),
				Budget:  budget.Unlimited(),
			},
			Observer: c,
		}
		payments := &guardrail.Policy{Name: "payments", Retry: guardrail.Retry{AttemptTimeout: 200 * time.Millisecond}, Observer: c}
		c.WatchPolicy(inventory)

		// The budget gauge is there before any call.
		diff(t, only(samples(t, reg), "guardrail_retry_budget_tokens"), map[string]float64{
			`guardrail_retry_budget_tokens{dependency="inventory",region="eu"}`: 2,
		})

		failing := func(fails int) func(context.Context) (int, error) {
			n := 0
			return func(ctx context.Context) (int, error) {
				n++
				if n <= fails {
					return 0, guardrail.Transient(errUnavailable)
				}
				return n, nil
			}
		}
		ctx := event.WithOperation(context.Background(), "GetStock")
		dctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()

		// 1. Succeeds at once, with a deadline of 1 s.
		if _, err := guardrail.Do(dctx, inventory, failing(0)); err != nil {
			t.Fatal(err)
		}
		// 2. Succeeds on the retry: 1 token spent, 1 left.
		if _, err := guardrail.Do(ctx, inventory, failing(1)); err != nil {
			t.Fatal(err)
		}
		// 3. Fails twice: the first retry spends the last whole token
		// (1.1 -> 0.1), the second is refused by the budget.
		if _, err := guardrail.Do(ctx, inventory, failing(5)); !errors.Is(err, guardrail.ErrBudgetExhausted) {
			t.Fatalf("call 3: %v, want ErrBudgetExhausted", err)
		}
		// 4. A permanent error: one attempt, ignored by the breaker.
		if _, err := guardrail.Do(ctx, inventory, func(context.Context) (int, error) {
			return 0, guardrail.Permanent(errors.New("400 bad request"))
		}); err == nil {
			t.Fatal("call 4 succeeded")
		}
		// 5. Fails three times: attempts exhausted.
		if _, err := guardrail.Do(ctx, search, failing(5)); !errors.Is(err, errUnavailable) {
			t.Fatalf("call 5: %v", err)
		}
		// 6. A payment that times out: outcome unknown, not retried.
		if _, err := guardrail.Do(ctx, payments, func(ctx context.Context) (int, error) {
			<-ctx.Done()
			return 0, ctx.Err()
		}); !errors.Is(err, guardrail.ErrOutcomeUnknown) {
			t.Fatalf("call 6: %v", err)
		}

		got := samples(t, reg)
		l := func(dep, rest string) string {
			return `{dependency="` + dep + `",operation="GetStock",` + rest + `region="eu"}`
		}
		diff(t, only(got, "guardrail_calls_total"), map[string]float64{
			"guardrail_calls_total" + l("inventory", `outcome="ok",`):               2,
			"guardrail_calls_total" + l("inventory", `outcome="budget_exhausted",`): 1,
			"guardrail_calls_total" + l("inventory", `outcome="error",`):            1,
			"guardrail_calls_total" + l("search", `outcome="error",`):               1,
			"guardrail_calls_total" + l("payments", `outcome="unknown",`):           1,
		})
		diff(t, only(got, "guardrail_attempts_total"), map[string]float64{
			"guardrail_attempts_total" + l("inventory", `outcome="success",`): 2,
			"guardrail_attempts_total" + l("inventory", `outcome="failure",`): 3,
			"guardrail_attempts_total" + l("inventory", `outcome="ignored",`): 1,
			"guardrail_attempts_total" + l("search", `outcome="failure",`):    3,
			"guardrail_attempts_total" + l("payments", `outcome="failure",`):  1,
		})
		diff(t, only(got, "guardrail_retries_total", "guardrail_retries_refused_total",
			"guardrail_retry_success_total", "guardrail_retry_exhausted_total", "guardrail_timeouts_total"), map[string]float64{
			"guardrail_retries_total" + l("inventory", `reason="backoff",`):                   2,
			"guardrail_retries_total" + l("search", `reason="backoff",`):                      2,
			"guardrail_retries_refused_total" + l("inventory", `reason="budget",`):            1,
			"guardrail_retries_refused_total" + l("search", `reason="attempts",`):             1,
			"guardrail_retry_success_total" + l("inventory", ""):                              1,
			"guardrail_retry_exhausted_total" + l("inventory", `outcome="budget_exhausted",`): 1,
			"guardrail_retry_exhausted_total" + l("search", `outcome="error",`):               1,
			"guardrail_timeouts_total" + l("payments", `phase="attempt",`):                    1,
		})
		// Only the first call had a deadline: 1 s left at its only attempt.
		diff(t, only(got, "guardrail_deadline_remaining_seconds_count", "guardrail_deadline_remaining_seconds_sum"), map[string]float64{
			"guardrail_deadline_remaining_seconds_count" + l("inventory", ""): 1,
			"guardrail_deadline_remaining_seconds_sum" + l("inventory", ""):   1,
		})
		// Time is fake: ops take no time, backoff waits are exactly 100 ms,
		// the payment attempt exactly its 200 ms timeout.
		diff(t, only(got, "guardrail_attempt_duration_seconds_sum", "guardrail_call_duration_seconds_sum"), map[string]float64{
			"guardrail_attempt_duration_seconds_sum" + l("inventory", `outcome="success",`): 0,
			"guardrail_attempt_duration_seconds_sum" + l("inventory", `outcome="failure",`): 0,
			"guardrail_attempt_duration_seconds_sum" + l("inventory", `outcome="ignored",`): 0,
			"guardrail_attempt_duration_seconds_sum" + l("search", `outcome="failure",`):    0,
			"guardrail_attempt_duration_seconds_sum" + l("payments", `outcome="failure",`):  0.2,
			"guardrail_call_duration_seconds_sum" + l("inventory", ""):                      0.2,
			"guardrail_call_duration_seconds_sum" + l("search", ""):                         0,
			"guardrail_call_duration_seconds_sum" + l("payments", ""):                       0.2,
		})
		diff(t, only(got, "guardrail_retry_budget_tokens"), map[string]float64{
			`guardrail_retry_budget_tokens{dependency="inventory",region="eu"}`: inventory.BudgetInUse().Tokens(),
		})
		if tok := inventory.BudgetInUse().Tokens(); tok < 0.1 || tok > 0.2 {
			t.Errorf("inventory tokens = %v, want 0.1 <= tokens <= 0.2", tok)
		}

		// Attempts per call and retry ratio from the series, as the
		// dashboard computes them: 10 attempts, 6 calls, 4 retries.
		sum := func(name string) (n float64) {
			for k, v := range only(got, name) {
				_ = k
				n += v
			}
			return n
		}
		if got, want := sum("guardrail_attempts_total")/sum("guardrail_calls_total"), 10.0/6; got != want {
			t.Errorf("attempts per call = %v, want %v", got, want)
		}
		if got, want := sum("guardrail_retries_total")/sum("guardrail_calls_total"), 4.0/6; got != want {
			t.Errorf("retry ratio = %v, want %v", got, want)
		}
	})
}

// TestBreakerTrip: a policy's breaker is exported closed from the first
// scrape, before any call; failures trip it; rejected calls, the half-open
// probe and every transition with its cause are counted.
func TestBreakerTrip(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		c := newCollector(t, prom.Config{})
		reg.MustRegister(c)
		p := &guardrail.Policy{
			Name: "payments", Retry: guardrail.Retry{
				MaxAttempts: 1,
			},
			Observer: c,
			Breaker:  must(breaker.New(breaker.Config{Name: "payments", MinRequests: 4, OpenFor: 10 * time.Second, OpenJitter: -1, Observer: c})),
		}
		c.WatchPolicy(p)
		state := func(closed, open, halfOpen float64) map[string]float64 {
			return map[string]float64{
				`guardrail_breaker_state{dependency="payments",key="",state="closed"}`:    closed,
				`guardrail_breaker_state{dependency="payments",key="",state="open"}`:      open,
				`guardrail_breaker_state{dependency="payments",key="",state="half_open"}`: halfOpen,
			}
		}
		diff(t, only(samples(t, reg), "guardrail_breaker_state"), state(1, 0, 0))

		ctx := context.Background()
		fail := func(context.Context) (int, error) { return 0, guardrail.Transient(errUnavailable) }
		for range 4 {
			_, _ = guardrail.Do(ctx, p, fail)
		}
		calls := 0
		for range 3 {
			if _, err := guardrail.Do(ctx, p, func(context.Context) (int, error) { calls++; return 1, nil }); !errors.Is(err, guardrail.ErrCircuitOpen) {
				t.Fatalf("call on an open breaker: %v", err)
			}
		}
		if calls != 0 {
			t.Fatalf("the open breaker let %d calls through", calls)
		}
		got := samples(t, reg)
		diff(t, only(got, "guardrail_breaker_state"), state(0, 1, 0))
		diff(t, only(got, "guardrail_calls_total", "guardrail_breaker_rejections_total", "guardrail_breaker_transitions_total"), map[string]float64{
			`guardrail_calls_total{dependency="payments",operation="",outcome="error"}`:                                4,
			`guardrail_calls_total{dependency="payments",operation="",outcome="circuit_open"}`:                         3,
			`guardrail_breaker_rejections_total{dependency="payments",operation=""}`:                                   3,
			`guardrail_breaker_transitions_total{dependency="payments",from="closed",reason="failure_rate",to="open"}`: 1,
		})

		// After the open time, one probe goes through and closes it.
		time.Sleep(10 * time.Second)
		if _, err := guardrail.Do(ctx, p, func(context.Context) (int, error) { return 1, nil }); err != nil {
			t.Fatal(err)
		}
		got = samples(t, reg)
		diff(t, only(got, "guardrail_breaker_state"), state(1, 0, 0))
		diff(t, only(got, "guardrail_breaker_probes_total", "guardrail_breaker_transitions_total"), map[string]float64{
			`guardrail_breaker_probes_total{dependency="payments",operation=""}`:                                             1,
			`guardrail_breaker_transitions_total{dependency="payments",from="closed",reason="failure_rate",to="open"}`:       1,
			`guardrail_breaker_transitions_total{dependency="payments",from="open",reason="open_elapsed",to="half_open"}`:    1,
			`guardrail_breaker_transitions_total{dependency="payments",from="half_open",reason="probes_passed",to="closed"}`: 1,
		})
	})
}

// TestBreakerGroupAndEvents: a group watched without a name exports its
// breakers under their keys as dependencies; a group watched under a name
// exports them under it, each with its key; a dependency nobody watches
// gets its gauge from transition events.
func TestBreakerGroupAndEvents(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := newCollector(t, prom.Config{})
	reg.MustRegister(c)
	hosts := must(breaker.NewGroup(breaker.GroupConfig{}))
	c.WatchBreakerGroup("", hosts)
	hosts.Get("a.internal")
	hosts.Get("b.internal").ForceOpen()
	users := must(breaker.NewGroup(breaker.GroupConfig{}))
	c.WatchBreakerGroup("users", users)
	users.Get("u1.internal:443").ForceOpen()
	c.Observe(context.Background(), event.Event{Kind: event.BreakerTransition, Dependency: "ledger", From: "closed", To: "open", Reason: "failure_rate"})
	c.Observe(context.Background(), event.Event{Kind: event.BreakerTransition, Dependency: "ledger", From: "open", To: "half_open", Reason: "open_elapsed"})
	// The transition of users' breaker as a transport reports it: under
	// the dependency's name, without the key. It must not add a series.
	c.Observe(context.Background(), event.Event{Kind: event.BreakerTransition, Dependency: "users", From: "closed", To: "open", Reason: "forced_open"})
	diff(t, only(samples(t, reg), "guardrail_breaker_state"), map[string]float64{
		`guardrail_breaker_state{dependency="a.internal",key="",state="closed"}`:              1,
		`guardrail_breaker_state{dependency="a.internal",key="",state="open"}`:                0,
		`guardrail_breaker_state{dependency="a.internal",key="",state="half_open"}`:           0,
		`guardrail_breaker_state{dependency="b.internal",key="",state="closed"}`:              0,
		`guardrail_breaker_state{dependency="b.internal",key="",state="open"}`:                1,
		`guardrail_breaker_state{dependency="b.internal",key="",state="half_open"}`:           0,
		`guardrail_breaker_state{dependency="ledger",key="",state="closed"}`:                  0,
		`guardrail_breaker_state{dependency="ledger",key="",state="open"}`:                    0,
		`guardrail_breaker_state{dependency="ledger",key="",state="half_open"}`:               1,
		`guardrail_breaker_state{dependency="users",key="u1.internal:443",state="closed"}`:    0,
		`guardrail_breaker_state{dependency="users",key="u1.internal:443",state="open"}`:      1,
		`guardrail_breaker_state{dependency="users",key="u1.internal:443",state="half_open"}`: 0,
	})
}

// TestServerEvents covers the events of the server side: shedding,
// admission, idempotency and bulkheads.
func TestServerEvents(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := newCollector(t, prom.Config{})
	reg.MustRegister(c)
	ctx := context.Background()
	for range 3 {
		c.Observe(ctx, event.Event{Kind: event.Shed, Dependency: "api", Operation: "POST /orders", Priority: "batch", Reason: event.ReasonCapacity, InFlight: 100, Limit: 100})
	}
	c.Observe(ctx, event.Event{Kind: event.Admit, Dependency: "api", Operation: "POST /orders", Priority: "critical", InFlight: 99, Limit: 120, Duration: 5 * time.Millisecond})
	c.Observe(ctx, event.Event{Kind: event.Idempotency, Dependency: "api", Operation: "POST /orders", Reason: event.ReasonReplayed})
	c.Observe(ctx, event.Event{Kind: event.BulkheadReject, Dependency: "db", Operation: "Query", Reason: event.ReasonBulkheadFull})
	c.Observe(ctx, event.Event{Kind: event.Timeout, Dependency: "db", Operation: "Query", Phase: event.PhaseConnect})

	got := samples(t, reg)
	diff(t, only(got, "guardrail_shed_total", "guardrail_admitted_total", "guardrail_idempotency_total",
		"guardrail_bulkhead_rejections_total", "guardrail_timeouts_total", "guardrail_shed_in_flight",
		"guardrail_shed_limit", "guardrail_queue_wait_seconds_count", "guardrail_queue_wait_seconds_sum"), map[string]float64{
		`guardrail_shed_total{dependency="api",operation="POST /orders",priority="batch",reason="capacity"}`: 3,
		`guardrail_admitted_total{dependency="api",operation="POST /orders",priority="critical"}`:            1,
		`guardrail_idempotency_total{dependency="api",operation="POST /orders",outcome="replayed"}`:          1,
		`guardrail_bulkhead_rejections_total{dependency="db",operation="Query",reason="bulkhead_full"}`:      1,
		`guardrail_timeouts_total{dependency="db",operation="Query",phase="connect"}`:                        1,
		`guardrail_shed_in_flight{dependency="api"}`:                                                         99,
		`guardrail_shed_limit{dependency="api"}`:                                                             120,
		`guardrail_queue_wait_seconds_count{dependency="api",priority="critical"}`:                           1,
		`guardrail_queue_wait_seconds_sum{dependency="api",priority="critical"}`:                             0.005,
	})

	// A watched shedder wins over the last event.
	sh := must(shed.New(shed.Config{Name: "api", Limit: 50}))
	for range 7 {
		if _, err := sh.Acquire(context.Background(), shed.Critical); err != nil {
			t.Fatal(err)
		}
	}
	c.WatchShedder("api", sh)
	diff(t, only(samples(t, reg), "guardrail_shed_in_flight", "guardrail_shed_limit"), map[string]float64{
		`guardrail_shed_in_flight{dependency="api"}`: 7,
		`guardrail_shed_limit{dependency="api"}`:     50,
	})
}

// TestCardinality: 10,000 distinct operations (raw URL paths, the classic
// mistake) and 10,000 distinct dependencies (hosts) give a bounded number
// of series, the excess folded into "other".
func TestCardinality(t *testing.T) {
	const maxValues = 20
	reg := prometheus.NewPedanticRegistry()
	c := newCollector(t, prom.Config{MaxLabelValues: maxValues})
	reg.MustRegister(c)
	p := &guardrail.Policy{Name: "users", Observer: c}
	run := func(from int) {
		for i := from; i < from+10_000; i++ {
			ctx := event.WithOperation(context.Background(), fmt.Sprintf("GET /users/%d", i))
			_, _ = guardrail.DoCall(ctx, p, guardrail.Call{Dependency: fmt.Sprintf("shard-%d.internal", i%500)}, okOp)
		}
	}
	run(0)
	// Each label keeps at most maxValues values, plus "other".
	if n := testutil.CollectAndCount(c, "guardrail_calls_total"); n > (maxValues+1)*(maxValues+1) {
		t.Errorf("guardrail_calls_total has %d series, want at most %d", n, (maxValues+1)*(maxValues+1))
	}
	got := samples(t, reg)
	var total float64
	ops := make(map[string]bool)
	for k, v := range only(got, "guardrail_calls_total") {
		total += v
		_, rest, _ := strings.Cut(k, `operation="`)
		op, _, _ := strings.Cut(rest, `"`)
		ops[op] = true
	}
	if total != 10_000 {
		t.Errorf("calls counted = %v, want 10000: folding must not lose calls", total)
	}
	if len(ops) != maxValues+1 || !ops["other"] {
		t.Errorf("%d operation values (other present: %v), want %d including %q", len(ops), ops["other"], maxValues+1, "other")
	}
	// Another 10,000 new values add no series.
	run(10_000)
	if n, m := len(got), len(samples(t, reg)); n != m {
		t.Errorf("%d samples after 10,000 calls, %d after 20,000: want no growth", n, m)
	}
}

// TestUnfitLabelValues: values that would break the exposition format or
// are obviously not names become "other".
func TestUnfitLabelValues(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := newCollector(t, prom.Config{})
	reg.MustRegister(c)
	for _, op := range []string{"\xff\xfe", strings.Repeat("a", 500)} {
		c.Observe(context.Background(), event.Event{Kind: event.CallEnd, Dependency: "x", Operation: op, Outcome: event.OutcomeOK})
	}
	diff(t, only(samples(t, reg), "guardrail_calls_total"), map[string]float64{
		`guardrail_calls_total{dependency="x",operation="other",outcome="ok"}`: 2,
	})
}

// TestConcurrentObserveAndScrape runs events and scrapes at once (for the
// race detector).
func TestConcurrentObserveAndScrape(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := newCollector(t, prom.Config{MaxLabelValues: 5})
	reg.MustRegister(c)
	c.WatchBreaker("a", must(breaker.New(breaker.Config{})))
	done := make(chan struct{})
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := range 500 {
				c.Observe(context.Background(), event.Event{Kind: event.CallEnd, Dependency: fmt.Sprint(g), Operation: fmt.Sprint(i % 9), Outcome: event.OutcomeOK, Attempt: 2})
				c.Observe(context.Background(), event.Event{Kind: event.BreakerTransition, Dependency: fmt.Sprint(i % 7), From: "closed", To: "open"})
			}
		}()
	}
	for range 20 {
		if _, err := reg.Gather(); err != nil {
			t.Fatal(err)
		}
	}
	for range 4 {
		<-done
	}
	var total float64
	for _, v := range only(samples(t, reg), "guardrail_calls_total") {
		total += v
	}
	if total != 2000 {
		t.Errorf("calls = %v, want 2000", total)
	}
}

// FuzzObserve: any event, whatever its strings, is recorded without panic
// and the registry still gathers (label values stay valid).
func FuzzObserve(f *testing.F) {
	f.Add(uint8(event.CallEnd), "pricing", "GET /x", "ok", "backoff", "attempt", "batch", "closed", "open")
	f.Add(uint8(event.Shed), "\xff", strings.Repeat("z", 200), "", "capacity", "", "", "", "")
	f.Add(uint8(event.BreakerTransition), "other", "other", "other", "other", "other", "other", "weird", "")
	c := newCollector(f, prom.Config{MaxLabelValues: 10})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	f.Fuzz(func(t *testing.T, kind uint8, dep, op, outcome, reason, phase, priority, from, to string) {
		e := event.Event{
			Kind: event.Kind(kind), Dependency: dep, Operation: op, Outcome: outcome,
			Reason: reason, Phase: phase, Priority: priority, From: from, To: to,
			Remaining: time.Second, Attempt: 2, InFlight: 3, Limit: 4,
		}
		c.Observe(context.Background(), e)
		if _, err := reg.Gather(); err != nil {
			t.Fatalf("Gather after %+v: %v", e, err)
		}
	})
}

// TestSeriesNames: Describe announces exactly the documented families.
func TestSeriesNames(t *testing.T) {
	names := registeredNames(newCollector(t, prom.Config{}))
	sort.Strings(names)
	if len(names) != 28 {
		t.Errorf("%d series families: %v", len(names), names)
	}
	for _, n := range names {
		if !strings.HasPrefix(n, "guardrail_") {
			t.Errorf("series %q lacks the guardrail_ prefix", n)
		}
	}
}

// registeredNames returns the metric names c describes.
func registeredNames(c prometheus.Collector) []string {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	var names []string
	for d := range ch {
		_, rest, _ := strings.Cut(d.String(), `fqName: "`)
		name, _, _ := strings.Cut(rest, `"`)
		names = append(names, name)
	}
	return names
}

// TestShedder: a real shedder's events and its watched load. Sheddable
// requests may fill only part of the limit, so the third one is shed.
func TestShedder(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := newCollector(t, prom.Config{})
	reg.MustRegister(c)
	s, err := shed.New(shed.Config{Name: "api", Limit: 4, Shares: map[shed.Priority]float64{shed.Sheddable: 0.5}, Observer: c})
	if err != nil {
		t.Fatal(err)
	}
	c.WatchShedder("api", s)
	diff(t, only(samples(t, reg), "guardrail_shed_in_flight", "guardrail_shed_limit"), map[string]float64{
		`guardrail_shed_in_flight{dependency="api"}`: 0,
		`guardrail_shed_limit{dependency="api"}`:     4,
	})
	ctx := event.WithOperation(context.Background(), "GET /feed")
	var tokens []shed.Token
	for range 3 {
		if tok, err := s.Acquire(ctx, shed.Sheddable); err == nil {
			tokens = append(tokens, tok)
		}
	}
	got := samples(t, reg)
	diff(t, only(got, "guardrail_shed_total", "guardrail_admitted_total", "guardrail_shed_in_flight", "guardrail_shed_limit"), map[string]float64{
		`guardrail_admitted_total{dependency="api",operation="GET /feed",priority="sheddable"}`:               2,
		`guardrail_shed_total{dependency="api",operation="GET /feed",priority="sheddable",reason="capacity"}`: 1,
		`guardrail_shed_in_flight{dependency="api"}`:                                                          2,
		`guardrail_shed_limit{dependency="api"}`:                                                              4,
	})
	for _, tok := range tokens {
		tok.Release()
	}
	// No event on release: only the watch brings the gauge back to zero.
	diff(t, only(samples(t, reg), "guardrail_shed_in_flight"), map[string]float64{
		`guardrail_shed_in_flight{dependency="api"}`: 0,
	})
}

// newCollector returns prom.New(cfg), failing the test on an error.
func newCollector(t testing.TB, cfg prom.Config) *prom.Collector {
	t.Helper()
	c, err := prom.New(cfg)
	if err != nil {
		t.Fatalf("prom.New: %v", err)
	}
	return c
}

// TestInvalidConfig: every invalid field is refused by New with an error
// that names it, says what it held and what is allowed, and Is
// ErrInvalidConfig; nothing is replaced by a default.
func TestInvalidConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  prom.Config
		want string
	}{
		{prom.Config{MaxLabelValues: -1}, "prom: Config.MaxLabelValues is -1; want 0 (the default, 100) or more"},
		{prom.Config{DurationBuckets: []float64{0.1, 0.05}}, "prom: Config.DurationBuckets is [0.1 0.05]; want finite boundaries in strictly increasing order, or none for the default"},
		{prom.Config{RemainingBuckets: []float64{1, 1}}, "prom: Config.RemainingBuckets is [1 1]; want finite boundaries in strictly increasing order, or none for the default"},
		{prom.Config{ConstLabels: prometheus.Labels{"dependency": "x"}}, `prom: Config.ConstLabels["dependency"] is set; want a name guardrail's series do not use`},
		{prom.Config{ConstLabels: prometheus.Labels{"le": "x"}}, `prom: Config.ConstLabels["le"] is set; want a name guardrail's series do not use`},
		{prom.Config{ConstLabels: prometheus.Labels{"1region": "x"}}, `prom: Config.ConstLabels["1region"] is set; want label names of letters, digits and underscores, not starting with a digit or "__"`},
		{prom.Config{ConstLabels: prometheus.Labels{"__name": "x"}}, `prom: Config.ConstLabels["__name"] is set; want label names of letters, digits and underscores, not starting with a digit or "__"`},
		{prom.Config{ConstLabels: prometheus.Labels{"region": "\xff"}}, `prom: Config.ConstLabels["region"] is "\xff"; want a valid UTF-8 value`},
		// Every invalid field is named, not only the first.
		{prom.Config{MaxLabelValues: -1, ConstLabels: prometheus.Labels{"le": "x", "region": "\xff"}},
			"prom: Config.MaxLabelValues is -1; want 0 (the default, 100) or more\n" +
				`prom: Config.ConstLabels["le"] is set; want a name guardrail's series do not use` + "\n" +
				`prom: Config.ConstLabels["region"] is "\xff"; want a valid UTF-8 value`},
	} {
		c, err := prom.New(tc.cfg)
		if c != nil || !errors.Is(err, prom.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, %v; want nil and ErrInvalidConfig", tc.cfg, c, err)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("New(%+v): %q, want %q", tc.cfg, err, tc.want)
		}
	}
	// Empty bucket lists are the defaults; a valid ConstLabel registers.
	c := newCollector(t, prom.Config{DurationBuckets: []float64{}, ConstLabels: prometheus.Labels{"region_2": "eu"}})
	if err := prometheus.NewPedanticRegistry().Register(c); err != nil {
		t.Errorf("Register: %v", err)
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

// TestConfigReloads: policy file reloads are counted by outcome alone; a
// process that never reloads a file exports no such series.
func TestConfigReloads(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	c := newCollector(t, prom.Config{})
	reg.MustRegister(c)
	diff(t, only(samples(t, reg), "guardrail_config_reloads_total"), map[string]float64{})
	ctx := context.Background()
	c.Observe(ctx, event.Event{Kind: event.ConfigReload, Outcome: event.OutcomeOK, Detail: "/etc/policy.yaml"})
	for range 2 {
		c.Observe(ctx, event.Event{Kind: event.ConfigReload, Outcome: event.OutcomeError, Detail: "/etc/policy.yaml", Err: errors.New("invalid")})
	}
	diff(t, only(samples(t, reg), "guardrail_config_reloads_total"), map[string]float64{
		`guardrail_config_reloads_total{outcome="ok"}`:    1,
		`guardrail_config_reloads_total{outcome="error"}`: 2,
	})
}
