package fault

import (
	"errors"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

func mustNew(t testing.TB, cfg Config) *Injector {
	t.Helper()
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func request(method, target string) *http.Request {
	return httptest.NewRequest(method, target, nil)
}

func TestProbabilityWithinBounds(t *testing.T) {
	const n = 20000
	for _, p := range []float64{0.01, 0.1, 0.5, 0.9} {
		in := mustNew(t, Config{Rand: NewRand(42), Rules: []Rule{{Probability: p, Fault: Reset{}}}})
		fired := 0
		for range n {
			plan, _, _ := in.decide(request("GET", "/"))
			if plan.fault != nil {
				fired++
			}
		}
		// Binomial: mean np, standard deviation sqrt(np(1-p)); allow 5 of them.
		mean, sd := n*p, math.Sqrt(n*p*(1-p))
		if math.Abs(float64(fired)-mean) > 5*sd {
			t.Errorf("p=%v: fired %d of %d, want %v ± %.0f", p, fired, n, mean, 5*sd)
		}
		c := in.Counters()[0]
		if c.Matched != n || c.Fired != uint64(fired) {
			t.Errorf("p=%v: counter %+v, want matched %d fired %d", p, c, n, fired)
		}
	}
}

// NewRand's source is safe for concurrent use and stays reproducible: the
// draws of many goroutines at once are the same values, in some order, as
// the same seed gives one goroutine.
func TestNewRandIsReproducibleAndSafeForConcurrentUse(t *testing.T) {
	const goroutines, each = 8, 1000
	seq := NewRand(11)
	want := make([]float64, goroutines*each)
	for i := range want {
		want[i] = seq()
		if want[i] < 0 || want[i] >= 1 {
			t.Fatalf("draw %d = %v, outside [0, 1)", i, want[i])
		}
	}
	shared := NewRand(11)
	got := make([]float64, goroutines*each)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				got[g*each+i] = shared()
			}
		})
	}
	wg.Wait()
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Error("concurrent draws from NewRand(11) are not the values of its sequence")
	}
	if NewRand(11)() == NewRand(12)() {
		t.Error("seeds 11 and 12 start with the same draw")
	}
}

// Config.Rand is a plain func() float64: every random choice comes from it.
func TestConfigRandDecidesEveryDraw(t *testing.T) {
	rules := []Rule{
		{Name: "half", Probability: 0.5, Fault: Status{Code: 500}},
		{Name: "uniform", Fault: Latency{Min: 100 * time.Millisecond, Max: 200 * time.Millisecond}},
		{Name: "tail", Fault: Latency{P50: 10 * time.Millisecond, P99: 100 * time.Millisecond}},
	}
	for _, tt := range []struct {
		draw  float64
		fires bool
		delay time.Duration // uniform + tail
	}{
		{0, true, 100 * time.Millisecond}, // and the tail draws a few µs, 8 standard deviations down
		{0.5, false, 150*time.Millisecond + 10*time.Millisecond},
	} {
		in := mustNew(t, Config{Rules: rules[1:], Rand: func() float64 { return tt.draw }})
		p, _, _ := in.decide(request("GET", "/"))
		if d := p.delay; d < tt.delay-time.Millisecond || d > tt.delay+time.Millisecond {
			t.Errorf("draw %v: delay %v, want %v", tt.draw, d, tt.delay)
		}
		in = mustNew(t, Config{Rules: rules[:1], Rand: func() float64 { return tt.draw }})
		p, _, _ = in.decide(request("GET", "/"))
		if fired := p.fault != nil; fired != tt.fires {
			t.Errorf("draw %v: probability 0.5 fired %v, want %v", tt.draw, fired, tt.fires)
		}
	}
	// A nil Rand is math/rand/v2's, and a Reconfigure without one keeps the
	// source in force.
	in := mustNew(t, Config{Rules: rules[:1], Rand: func() float64 { return 0.9 }})
	if err := setRules(in, rules[:1]); err != nil {
		t.Fatal(err)
	}
	if p, _, _ := in.decide(request("GET", "/")); p.fault != nil {
		t.Error("after a Reconfigure without Rand the injector drew from another source than Config.Rand")
	}
	if _, err := New(Config{Rules: rules}); err != nil {
		t.Errorf("New with a nil Rand: %v", err)
	}
}

func TestNewRejectsABadHeaderName(t *testing.T) {
	_, err := New(Config{HeaderFaults: true, Header: "X Bad"})
	if want := `fault: invalid config: Config.Header is "X Bad"; want a header name`; err == nil || err.Error() != want || !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("New = %v; want %q", err, want)
	}
}

func TestSeedReplaysTheSameFaults(t *testing.T) {
	rules := []Rule{
		{Name: "lat", Probability: 0.5, Fault: Latency{P50: 10 * time.Millisecond, P99: time.Second}},
		{Name: "err", Probability: 0.3, Fault: Status{Code: 503}},
		{Name: "reset", Probability: 0.2, Fault: Reset{}},
	}
	run := func(seed uint64) []plan {
		in := mustNew(t, Config{Rules: rules, Rand: NewRand(seed)})
		var out []plan
		for range 200 {
			p, _, _ := in.decide(request("GET", "/"))
			out = append(out, p)
		}
		return out
	}
	a, b, c := run(7), run(7), run(8)
	if !slices.Equal(a, b) {
		t.Error("the same seed gave different faults")
	}
	if slices.Equal(a, c) {
		t.Error("different seeds gave the same faults")
	}
}

func TestFirstTerminalFaultWinsAndLatencyAdds(t *testing.T) {
	in := mustNew(t, Config{Rules: []Rule{
		{Name: "a", Fault: Latency{Delay: 10 * time.Millisecond}},
		{Name: "b", Fault: Latency{Delay: 5 * time.Millisecond}},
		{Name: "c", Match: Match{Path: "/x"}, Fault: Status{Code: 500}},
		{Name: "d", Fault: Status{Code: 502}},
		{Name: "e", Fault: Reset{}},
	}})
	p, _, _ := in.decide(request("GET", "/y"))
	if p.delay != 15*time.Millisecond || p.fault != (Status{Code: 502}) {
		t.Errorf("plan = %+v, want 15ms then 502", p)
	}
	got := in.Counters()
	want := []uint64{1, 1, 0, 1, 0} // e is never reached
	for i, c := range got {
		if c.Matched != want[i] {
			t.Errorf("rule %s matched %d, want %d", c.Rule, c.Matched, want[i])
		}
	}
}

func TestLatencyDistributions(t *testing.T) {
	const n = 20000
	quantile := func(ds []time.Duration, q float64) time.Duration {
		slices.Sort(ds)
		return ds[int(q*float64(len(ds)-1))]
	}
	draw := func(l Latency) []time.Duration {
		in := mustNew(t, Config{Rand: NewRand(3), Rules: []Rule{{Fault: l}}})
		ds := make([]time.Duration, n)
		for i := range ds {
			p, _, _ := in.decide(request("GET", "/"))
			ds[i] = p.delay
		}
		return ds
	}
	near := func(t *testing.T, name string, got, want time.Duration, tol float64) {
		t.Helper()
		if math.Abs(float64(got-want)) > tol*float64(want) {
			t.Errorf("%s = %v, want %v ± %.0f%%", name, got, want, tol*100)
		}
	}
	t.Run("fixed", func(t *testing.T) {
		ds := draw(Latency{Delay: 42 * time.Millisecond})
		if ds[0] != 42*time.Millisecond || ds[n-1] != 42*time.Millisecond {
			t.Errorf("got %v, %v; want 42ms", ds[0], ds[n-1])
		}
	})
	t.Run("uniform", func(t *testing.T) {
		ds := draw(Latency{Min: 100 * time.Millisecond, Max: 300 * time.Millisecond})
		if lo, hi := slices.Min(ds), slices.Max(ds); lo < 100*time.Millisecond || hi > 300*time.Millisecond {
			t.Errorf("range [%v, %v], want within [100ms, 300ms]", lo, hi)
		}
		near(t, "p50", quantile(ds, 0.5), 200*time.Millisecond, 0.03)
		near(t, "p10", quantile(ds, 0.1), 120*time.Millisecond, 0.05)
	})
	t.Run("long tail", func(t *testing.T) {
		ds := draw(Latency{P50: 20 * time.Millisecond, P99: 800 * time.Millisecond})
		near(t, "p50", quantile(ds, 0.5), 20*time.Millisecond, 0.08)
		near(t, "p99", quantile(ds, 0.99), 800*time.Millisecond, 0.2)
		if hi := slices.Max(ds); hi > 8*time.Second {
			t.Errorf("max %v, want capped at 10 × p99", hi)
		}
	})
	t.Run("long tail bounds", func(t *testing.T) {
		ds := draw(Latency{Min: 15 * time.Millisecond, P50: 20 * time.Millisecond, P99: 800 * time.Millisecond, Max: time.Second})
		if lo, hi := slices.Min(ds), slices.Max(ds); lo != 15*time.Millisecond || hi != time.Second {
			t.Errorf("range [%v, %v], want clamped to exactly [15ms, 1s]", lo, hi)
		}
	})
}

func TestMiddlewareLatencyExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := mustNew(t, Config{Rules: []Rule{
			{Fault: Latency{Delay: 300 * time.Millisecond}},
			{Fault: Latency{Delay: 200 * time.Millisecond}},
		}})
		calls := 0
		h := in.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			calls++
			io.WriteString(w, "ok")
		}))
		start := time.Now()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request("GET", "/"))
		if got, want := time.Since(start), 500*time.Millisecond; got != want {
			t.Errorf("took %v, want %v", got, want)
		}
		if rec.Code != 200 || calls != 1 {
			t.Errorf("status %d, calls %d; want 200, 1", rec.Code, calls)
		}
	})
}

func TestMiddlewareSlowBodyExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := mustNew(t, always(SlowBody{Bytes: 4, Every: time.Second}))
		h := in.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "<html>0123456789") // 16 bytes: 4 pieces
		}))
		start := time.Now()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, request("GET", "/"))
		if got, want := time.Since(start), 4*time.Second; got != want {
			t.Errorf("took %v, want %v", got, want)
		}
		if got := rec.Body.String(); got != "<html>0123456789" {
			t.Errorf("body = %q", got)
		}
		if got := rec.Header().Get("Content-Type"); !strings.HasPrefix(got, "text/html") {
			t.Errorf("Content-Type = %q, want sniffed text/html", got)
		}
	})
}

func TestReconfigureKeepsCountersByName(t *testing.T) {
	in := mustNew(t, Config{Rules: []Rule{{Name: "a", Fault: Reset{}}, {Name: "b", Fault: Reset{}}}})
	in.decide(request("GET", "/"))
	if err := setRules(in, []Rule{{Name: "a", Fault: Status{}}, {Name: "c", Fault: Hang{}}}); err != nil {
		t.Fatal(err)
	}
	got := in.Counters()
	want := []Counter{{"a", kindError, 1, 1}, {"c", kindHang, 0, 0}}
	if !slices.Equal(got, want) {
		t.Errorf("counters = %+v, want %+v", got, want)
	}
	in.resetCounters()
	if c := in.Counters()[0]; c.Matched != 0 || c.Fired != 0 {
		t.Errorf("after reset: %+v", c)
	}
	// A bad set leaves everything as it was.
	err := setRules(in, []Rule{{Name: "x", Fault: Status{Code: 200}}})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig", err)
	}
	if got := in.Config().Rules; len(got) != 2 || got[0].Name != "a" {
		t.Errorf("rules changed by a rejected set: %+v", got)
	}
}

func TestRuleValidation(t *testing.T) {
	tests := []struct {
		rule  Rule
		field string
	}{
		{Rule{}, "kind"},
		{Rule{Name: "bad name", Fault: Reset{}}, "name"},
		{Rule{Probability: 1.5, Fault: Reset{}}, "probability"},
		{Rule{Probability: math.NaN(), Fault: Reset{}}, "probability"},
		{Rule{Fault: Latency{}}, "delay"},
		{Rule{Fault: Latency{Delay: -1}}, "delay"},
		{Rule{Fault: Latency{Delay: 1, Max: 2}}, "delay"},
		{Rule{Fault: Latency{Min: 2, Max: 1}}, "min"},
		{Rule{Fault: Latency{Min: 2}}, "max"},
		{Rule{Fault: Latency{P99: 2}}, "p50"},
		{Rule{Fault: Latency{P50: 3, P99: 2}}, "p99"},
		{Rule{Fault: Latency{P50: 3, P99: 5, Max: 4}}, "max"},
		{Rule{Fault: Status{Code: 302}}, "status"},
		{Rule{Fault: Status{RetryAfter: -time.Second}}, "retry_after"},
		{Rule{Fault: Status{RetryAfter: time.Second, RetryAfterRaw: "x"}}, "retry_after_raw"},
		{Rule{Fault: Status{RetryAfterRaw: "a\r\nb"}}, "retry_after_raw"},
		{Rule{Fault: SlowBody{Bytes: -1}}, "bytes"},
		{Rule{Fault: Truncate{Bytes: -1}}, "bytes"},
		{Rule{Match: Match{Path: "api"}, Fault: Reset{}}, "match.path"},
		{Rule{Match: Match{Path: "/a/**/b"}, Fault: Reset{}}, "match.path"},
		{Rule{Match: Match{Path: "/[a"}, Fault: Reset{}}, "match.path"},
		{Rule{Match: Match{Host: "[x"}, Fault: Reset{}}, "match.host"},
		{Rule{Match: Match{Methods: []string{"GE T"}}, Fault: Reset{}}, "match.methods"},
		{Rule{Match: Match{Headers: map[string]string{"X-A": ""}}, Fault: Reset{}}, "match.headers"},
		{Rule{Match: Match{Headers: map[string]string{"X A": "1"}}, Fault: Reset{}}, "match.headers"},
	}
	for _, tt := range tests {
		_, err := New(Config{Rules: []Rule{{Name: "ok", Fault: Reset{}}, tt.rule}})
		var re *RuleError
		if !errors.As(err, &re) || !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%+v: err = %v, want a *RuleError", tt.rule, err)
			continue
		}
		if re.Index != 1 || re.Field != tt.field {
			t.Errorf("%+v: error names rule %d field %q, want rule 1 field %q (%v)", tt.rule, re.Index, re.Field, tt.field, err)
		}
	}
	_, err := New(Config{Rules: []Rule{{Name: "x", Fault: Reset{}}, {Name: "x", Fault: Hang{}}}})
	if err == nil || !strings.Contains(err.Error(), `rule 1 (x): name: "x" is already the name of rule 0`) {
		t.Errorf("duplicate names: err = %v", err)
	}
	// Every invalid field is named, not only the first: two of one rule,
	// one of another, and the Config's own.
	_, err = New(Config{Header: "X Fault", Rules: []Rule{
		{Probability: 2, Match: Match{Path: "api"}, Fault: Reset{}},
		{Name: "ok", Fault: Reset{}},
		{Fault: Truncate{Bytes: -1}},
	}})
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("many invalid fields: err = %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"rule 0 (rule-0): probability:", "rule 0 (rule-0): match.path:", "rule 2 (rule-2): bytes:", `Config.Header is "X Fault"`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("many invalid fields: %q does not name %q", err, want)
		}
	}
}

func TestMatch(t *testing.T) {
	tests := []struct {
		match  Match
		method string
		target string
		header map[string]string
		want   bool
	}{
		{Match{}, "GET", "/", nil, true},
		{Match{Methods: []string{"POST", "PUT"}}, "PUT", "/", nil, true},
		{Match{Methods: []string{"POST"}}, "GET", "/", nil, false},
		{Match{Path: "/api/**"}, "GET", "/api", nil, true},
		{Match{Path: "/api/**"}, "GET", "/api/", nil, true},
		{Match{Path: "/api/**"}, "GET", "/api/v1/orders", nil, true},
		{Match{Path: "/api/**"}, "GET", "/apix", nil, false},
		{Match{Path: "/**"}, "GET", "/anything/at/all", nil, true},
		{Match{Path: "/v*/orders/**"}, "GET", "/v2/orders/7", nil, true},
		{Match{Path: "/v*/orders/**"}, "GET", "/v2/users/7", nil, false},
		{Match{Path: "/orders/*"}, "GET", "/orders/7", nil, true},
		{Match{Path: "/orders/*"}, "GET", "/orders/7/items", nil, false},
		{Match{Host: "example.com:*"}, "GET", "http://EXAMPLE.com:8080/", nil, true},
		{Match{Host: "*.internal"}, "GET", "http://example.com/", nil, false},
		{Match{Headers: map[string]string{"X-Canary": "1"}}, "GET", "/", map[string]string{"x-canary": "1"}, true},
		{Match{Headers: map[string]string{"X-Canary": "1"}}, "GET", "/", map[string]string{"x-canary": "2"}, false},
		{Match{Headers: map[string]string{"X-Canary": "*"}}, "GET", "/", map[string]string{"x-canary": "zz"}, true},
		{Match{Headers: map[string]string{"X-Canary": "*"}}, "GET", "/", nil, false},
		{Match{Headers: map[string]string{"User-Agent": "curl/*"}}, "GET", "/", map[string]string{"User-Agent": "curl/8.1"}, true},
	}
	for _, tt := range tests {
		in := mustNew(t, Config{Rules: []Rule{{Match: tt.match, Fault: Reset{}}}})
		r := request(tt.method, tt.target)
		for k, v := range tt.header {
			r.Header.Set(k, v)
		}
		p, _, _ := in.decide(r)
		if got := p.fault != nil; got != tt.want {
			t.Errorf("%+v on %s %s %v: matched %v, want %v", tt.match, tt.method, tt.target, tt.header, got, tt.want)
		}
	}
}

func TestConcurrentUse(t *testing.T) {
	in := mustNew(t, Config{Rules: []Rule{
		{Name: "l", Probability: 0.5, Fault: Latency{Max: time.Microsecond}},
		{Name: "e", Probability: 0.5, Fault: Status{}},
	}})
	h := in.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			for range 200 {
				h.ServeHTTP(httptest.NewRecorder(), request("GET", "/"))
				if i == 0 {
					_ = setRules(in, in.Config().Rules)
					_ = in.Counters()
				}
			}
		})
	}
	wg.Wait()
	if c := in.Counters(); c[0].Matched != 1600 {
		t.Errorf("rule l matched %d, want 1600", c[0].Matched)
	}
}

// setRules replaces the rules of in, keeping its header settings.
func setRules(in *Injector, rules []Rule) error {
	cfg := in.Config()
	cfg.Rules = rules
	return in.Reconfigure(cfg)
}
