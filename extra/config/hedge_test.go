package config

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"reflect"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/throttle"
)

const hedgeFile = `
defaults:
  backoff: {strategy: none}
dependencies:
  api:
    reason: "tests"
    max_attempts: 1
    attempt_timeout: 2s
    breaker: {mode: disabled}  # the test counts what the throttle does alone
    throttle: {window: 1h, k: 2}
  slow:
    reason: "tests"
    hedge: {delay: 20ms}
  ledger:
    kind: policy
    reason: "tests"
    idempotent: true
    hedge: {delay: 20ms}
    throttle: {}
  stock:
    kind: grpc
    reason: "tests"
    idempotent_methods: [/stock.v1.Stock/]
    hedge: {percentile: 0.9}
    throttle: {k: 3}
`

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// A throttler is shared by every client of its dependency and survives
// the reloads that leave its settings alone, under concurrent callers:
// its window holds every request of every client, before and after each
// reload. New settings make a fresh one.
func TestThrottlerSurvivesReloadUnderLoad(t *testing.T) {
	var hits, oks atomic.Int64
	ts := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Query().Has("fail") {
			w.WriteHeader(http.StatusServiceUnavailable) // an overload answer: not an accept
			return
		}
		io.WriteString(w, "ok")
	}))
	var changed []string
	var chMu sync.Mutex
	reg, err := New("policy.yaml", []byte(hedgeFile), Options{Logger: quiet(), OnReload: func(r ReloadResult) {
		chMu.Lock()
		changed = append(changed, r.Changed...)
		chMu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	first, _, _ := reg.HTTPConfig("api")
	th := first.Throttler
	if th == nil {
		t.Fatal("the throttle section built no Throttler")
	}
	clients := make([]*http.Client, 2)
	for i := range clients {
		clients[i], _ = reg.HTTPClient("api")
	}
	var throttled atomic.Int64
	call := func(c *http.Client, fail bool) {
		url := ts.URL
		if fail {
			url += "?fail"
		}
		resp, err := c.Get(url)
		switch {
		case errors.Is(err, guardrail.ErrThrottled):
			throttled.Add(1)
			return
		case err != nil:
			t.Error(err)
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			oks.Add(1)
		}
	}
	// One call alone first: the throttler's first bucket is set up by the
	// first call into it, and calls racing with that set-up may go
	// uncounted (the throttler says its counts are approximate by so
	// much), which this test, counting exactly, must not meet.
	call(clients[0], false)

	const callers, calls = 8, 60
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for j := range calls {
				call(clients[i%2], (i+j)%3 != 0) // two thirds fail: the throttle rejects some
			}
		}()
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	close(start)
	// Reload until the callers are done, at least 10 times, each time
	// with a new attempt timeout: a new Transport, the same throttler.
	reloads := 0
	for done := false; !done || reloads < 10; reloads++ {
		select {
		case <-finished:
			done = true
		default:
		}
		data := strings.Replace(hedgeFile, "attempt_timeout: 2s", fmt.Sprintf("attempt_timeout: %ds", 2+reloads%2), 1)
		if err := reg.ReloadBytes([]byte(data)); err != nil {
			t.Fatal(err)
		}
		if c, _, _ := reg.HTTPConfig("api"); c.Throttler != th {
			t.Fatalf("reload %d replaced the throttler, whose settings did not change", reloads)
		}
	}
	wg.Wait()
	req, acc := th.Counts()
	if want := hits.Load() + throttled.Load(); req != want {
		t.Errorf("the throttler counts %d requests; want %d (%d sent, %d rejected) across %d reloads", req, want, hits.Load(), throttled.Load(), reloads)
	}
	if acc != oks.Load() {
		t.Errorf("the throttler counts %d accepts; want %d, the 200s", acc, oks.Load())
	}
	if throttled.Load() == 0 {
		t.Errorf("no request was throttled with two in three refused; want some")
	}
	t.Logf("%d calls, %d sent, %d throttled, %d reloads", 1+callers*calls, hits.Load(), throttled.Load(), reloads)
	chMu.Lock()
	if !contains(changed, "api") {
		t.Errorf("the reloads changed %v; want api among them (its attempt timeout changed)", changed)
	}
	chMu.Unlock()

	// The admin listing shows the throttler's window.
	var listed *throttlerState
	for _, s := range reg.status().Throttlers {
		if s.Dependency == "api" {
			listed = &s
		}
	}
	if listed == nil || listed.Requests != req || listed.Accepts != acc || listed.Settings["window"] != "1h0m0s" || listed.Settings["k"] != 2.0 {
		t.Errorf("the admin listing has %+v; want api with %d requests, %d accepts, window 1h, k 2", listed, req, acc)
	}

	// New settings: a fresh throttler, which the clients handed out
	// before use from their next request on.
	if err := reg.ReloadBytes([]byte(strings.Replace(hedgeFile, "k: 2}", "k: 3}", 1))); err != nil {
		t.Fatal(err)
	}
	c, _, _ := reg.HTTPConfig("api")
	if c.Throttler == th {
		t.Fatal("a reload of k kept the old throttler")
	}
	call(clients[1], false)
	if r, a := c.Throttler.Counts(); r != 1 || a != 1 {
		t.Errorf("the new throttler counts %d requests, %d accepts after one call; want 1, 1", r, a)
	}
	if r, _ := th.Counts(); r != req {
		t.Errorf("the old throttler counted a call after the reload: %d requests; want %d", r, req)
	}
}

// A hedged HTTP client from the file is the one built by hand from the
// same numbers: the same HedgeConfig, and against a server whose first
// attempt of each call hangs, the same requests seen, every call answered
// by its hedge.
func TestHTTPHedgeEqualsHandBuilt(t *testing.T) {
	var seen sync.Map
	var hits atomic.Int64
	release := make(chan struct{})
	ts := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if _, again := seen.LoadOrStore(r.URL.Query().Get("call"), true); !again {
			// The first attempt of a call hangs until the client gives
			// it up.
			select {
			case <-r.Context().Done():
			case <-release:
			}
			return
		}
		io.WriteString(w, "hedge")
	}))
	t.Cleanup(func() { close(release) }) // before the server closes: cleanups run last first

	reg, err := New("policy.yaml", []byte(hedgeFile), Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	got, _, _ := reg.HTTPConfig("slow")
	hand := guardhttp.Config{Name: "slow", Retry: guardrail.Retry{Backoff: got.Backoff}, Hedge: &guardrail.HedgeConfig{Delay: 20 * time.Millisecond}}
	if !reflect.DeepEqual(got.Hedge, hand.Hedge) || got.Throttler != nil {
		t.Errorf("the file's Hedge %+v, Throttler %v; want %+v and none", got.Hedge, got.Throttler, hand.Hedge)
	}
	fromFile, _ := reg.HTTPClient("slow")
	byHand, err := guardhttp.NewClient(hand)
	if err != nil {
		t.Fatal(err)
	}
	const calls = 4 // hedges spend budget tokens: 4 leave the default budget above half
	for name, c := range map[string]*http.Client{"file": fromFile, "hand": byHand} {
		hits.Store(0)
		for i := range calls {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, fmt.Sprintf("%s?call=%s%d", ts.URL, name, i), nil)
			start := time.Now()
			resp, err := c.Do(req)
			if err != nil {
				cancel()
				t.Fatalf("%s client, call %d: %v after %v; want the hedge's answer", name, i, err, time.Since(start))
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			cancel()
			if string(body) != "hedge" {
				t.Errorf("%s client, call %d: %q; want the hedge's answer", name, i, body)
			}
		}
		if n := hits.Load(); n != 2*calls {
			t.Errorf("the %s client sent %d requests for %d calls; want %d, a first attempt and a hedge each", name, n, calls, 2*calls)
		}
	}
}

// A hedged policy from the file is the one built by hand: with an
// operation whose first attempt of each call hangs, guardrail.DoHedged
// runs it the same number of times under the handle's policy (and
// deadline) as under one built by hand, and the throttler is the file's.
// guardrail.Do never hedges.
func TestPolicyHedgeEqualsHandBuilt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg, err := New("policy.yaml", []byte(hedgeFile), Options{Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		h, err := reg.Policy("ledger")
		if err != nil {
			t.Fatal(err)
		}
		p := h.Policy()
		wantHedge := &guardrail.HedgeConfig{Delay: 20 * time.Millisecond}
		if !reflect.DeepEqual(p.Hedge, wantHedge) || p.Throttler == nil {
			t.Fatalf("the file's Hedge %+v, Throttler %v; want %+v and one", p.Hedge, p.Throttler, wantHedge)
		}
		th, _ := throttle.New(throttle.Config{})
		hand := &guardrail.Policy{Name: "ledger", Idempotent: true, Retry: guardrail.Retry{Backoff: p.Backoff}, Hedge: &guardrail.HedgeConfig{Delay: 20 * time.Millisecond}, Throttler: th}

		// op hangs in its first attempt of each call, and answers at once
		// in the others.
		var runs atomic.Int64
		op := func(first *atomic.Bool) func(ctx context.Context) (string, error) {
			return func(ctx context.Context) (string, error) {
				runs.Add(1)
				if first.CompareAndSwap(false, true) {
					<-ctx.Done()
					return "", ctx.Err()
				}
				return "hedge", nil
			}
		}
		for name, run := range map[string]func(ctx context.Context, op func(context.Context) (string, error)) (string, error){
			"file": func(ctx context.Context, op func(context.Context) (string, error)) (string, error) {
				return doHedged(ctx, h, guardrail.Call{}, op)
			},
			"hand": func(ctx context.Context, op func(context.Context) (string, error)) (string, error) {
				return guardrail.DoHedged(ctx, hand, guardrail.Call{}, op)
			},
		} {
			runs.Store(0)
			for i := range 4 {
				start := time.Now()
				v, err := run(context.Background(), op(new(atomic.Bool)))
				if err != nil || v != "hedge" || time.Since(start) != 20*time.Millisecond {
					t.Errorf("%s, call %d: %q, %v after %v; want the hedge's answer after its 20ms delay", name, i, v, err, time.Since(start))
				}
			}
			synctest.Wait() // the losers' goroutines end
			if n := runs.Load(); n != 8 {
				t.Errorf("%s: op ran %d times for 4 calls; want 8, an attempt and a hedge each", name, n)
			}
		}
		if r, a := p.Throttler.Counts(); r != 8 || a != 8 {
			t.Errorf("the file's throttler counts %d requests, %d accepts; want 8, 8 (a loser cancelled by its hedge says nothing against the dependency)", r, a)
		}

		// Do never hedges: the first attempt is the only one, and it runs
		// to the deadline.
		runs.Store(0)
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := do(ctx, h, op(new(atomic.Bool))); err == nil || runs.Load() != 1 {
			t.Errorf("Do: %v after %d runs; want the deadline after one", err, runs.Load())
		}
	})
}

// Hedging and throttling follow reloads: settings that did not change keep
// the dependency's values, new ones replace them, and a dependency that
// drops its sections stops hedging and throttling.
func TestHedgeFollowsReload(t *testing.T) {
	var changed []string
	reg, err := New("policy.yaml", []byte(hedgeFile), Options{Logger: quiet(), OnReload: func(r ReloadResult) { changed = r.Changed }})
	if err != nil {
		t.Fatal(err)
	}
	ledger, _ := reg.Policy("ledger")
	p := ledger.Policy()

	// Another dependency changes: ledger and slow keep theirs, throttler
	// and latencies included.
	base := strings.Replace(hedgeFile, "attempt_timeout: 2s", "attempt_timeout: 3s", 1)
	if err := reg.ReloadBytes([]byte(base)); err != nil {
		t.Fatal(err)
	}
	if got, want := changed, []string{"api"}; !reflect.DeepEqual(got, want) {
		t.Errorf("changed %v; want %v", got, want)
	}
	if ledger.Policy() != p {
		t.Error("a reload that left ledger alone replaced its policy")
	}

	// A new hedge delay: a new policy, the same throttler.
	file := strings.Replace(base, "    hedge: {delay: 20ms}\n    throttle: {}", "    hedge: {delay: 30ms, max_hedges: 2}\n    throttle: {}", 1)
	if err := reg.ReloadBytes([]byte(file)); err != nil {
		t.Fatal(err)
	}
	np := ledger.Policy()
	if np == p || !reflect.DeepEqual(np.Hedge, &guardrail.HedgeConfig{Delay: 30 * time.Millisecond, MaxHedges: 2}) || np.Throttler != p.Throttler {
		t.Errorf("after a new hedge delay: hedge %+v, same throttler %v; want delay 30ms, 2 hedges, the same throttler", np.Hedge, np.Throttler == p.Throttler)
	}
	if !reflect.DeepEqual(changed, []string{"ledger"}) {
		t.Errorf("changed %v; want [ledger]", changed)
	}

	// Sections gone: no hedging, no throttling.
	file = strings.Replace(base, "    hedge: {delay: 20ms}\n    throttle: {}\n", "", 1)
	file = strings.Replace(file, "    hedge: {delay: 20ms}\n", "", 1)
	if err := reg.ReloadBytes([]byte(file)); err != nil {
		t.Fatal(err)
	}
	if np := ledger.Policy(); np.Hedge != nil || np.Throttler != nil {
		t.Errorf("ledger without its sections: hedge %v, throttler %v; want neither", np.Hedge, np.Throttler)
	}
	if c, _, _ := reg.HTTPConfig("slow"); c.Hedge != nil {
		t.Errorf("slow without its hedge: %+v; want none", c.Hedge)
	}

	// An invalid hedge is rejected as a whole: the settings in force stay.
	bad := strings.Replace(hedgeFile, "hedge: {delay: 20ms}\n    throttle", "hedge: {delay: 20ms, window: 3}\n    throttle", 1)
	if err := reg.ReloadBytes([]byte(bad)); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "dependencies.ledger.hedge.window: is 3") {
		t.Errorf("a reload with window 3: %v; want ErrInvalidConfig naming dependencies.ledger.hedge.window", err)
	}
	if np := ledger.Policy(); np.Hedge != nil {
		t.Errorf("a rejected reload changed ledger's hedge to %+v", np.Hedge)
	}
}

// A HedgeConfig handed out is a copy: changing it changes nothing in
// force.
func TestHTTPConfigHedgeIsACopy(t *testing.T) {
	reg, err := New("policy.yaml", []byte(hedgeFile), Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	c, _, _ := reg.HTTPConfig("slow")
	c.Hedge.Delay = time.Hour
	if again, _, _ := reg.HTTPConfig("slow"); again.Hedge.Delay != 20*time.Millisecond {
		t.Errorf("a change to a HedgeConfig handed out reached the Registry: delay %v", again.Hedge.Delay)
	}
}

// The report shows each way of writing a delay, the defaults filled in,
// and a dependency that turns off the defaults' hedging shows what it
// turns off.
func TestReportShowsHedgeAndThrottle(t *testing.T) {
	c, err := parse("policy.yaml", []byte(`
defaults:
  hedge: {delay: 50ms}
dependencies:
  fixed: {}
  adaptive: {reason: r, hedge: {percentile: 0.99, window: 200, max_hedges: 2, overload_pause: 1m}}
  default: {reason: r, hedge: {delay: 0s}, throttle: {k: 1.5}}
  none: {reason: r, hedge: {disabled: true}, throttle: {window: 30s}}
  ledger: {kind: policy, reason: r, idempotent: true}
`))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Warnings) != 0 {
		t.Errorf("warnings %v; want none", c.Warnings)
	}
	rep := c.report()
	eff := map[string]map[string]string{}
	diff := map[string]map[string]string{}
	for _, d := range rep.Dependencies {
		eff[d.Name], diff[d.Name] = map[string]string{}, map[string]string{}
		for _, s := range d.Effective {
			eff[d.Name][s.Key] = s.Value
		}
		for _, df := range d.Differences {
			diff[d.Name][df.Key] = df.Default
		}
	}
	for _, tc := range []struct{ dep, key, want string }{
		{"fixed", "hedge.delay", "fixed 50ms"},
		{"fixed", "hedge.max_hedges", "1"},
		{"fixed", "hedge.overload_pause", "10s"},
		{"fixed", "hedge.percentile", ""},
		{"fixed", "throttle", "off"},
		{"ledger", "hedge.delay", "fixed 50ms"},
		{"adaptive", "hedge.delay", "adaptive, at least 50ms"},
		{"adaptive", "hedge.percentile", "0.99"},
		{"adaptive", "hedge.window", "200"},
		{"adaptive", "hedge.max_hedges", "2"},
		{"adaptive", "hedge.overload_pause", "1m0s"},
		{"default", "hedge.delay", "adaptive, no floor"},
		{"default", "hedge.percentile", "0.95"},
		{"default", "hedge.window", "1000"},
		{"default", "throttle.window", "2m0s"},
		{"default", "throttle.k", "1.5"},
		{"none", "hedge", "off"},
		{"none", "throttle.window", "30s"},
		{"none", "throttle.k", "2"},
	} {
		if got := eff[tc.dep][tc.key]; got != tc.want {
			t.Errorf("%s %s = %q; want %q", tc.dep, tc.key, got, tc.want)
		}
	}
	if got, want := diff["none"]["hedge"], "delay fixed 50ms, max_hedges 1, overload_pause 10s"; got != want {
		t.Errorf("none's hedge: default %q; want %q", got, want)
	}
	if got, want := diff["none"]["throttle.k"], "throttle off"; got != want {
		t.Errorf("none's throttle.k: default %q; want %q", got, want)
	}
	if len(diff["fixed"]) != 0 {
		t.Errorf("fixed differs %v; want nothing", diff["fixed"])
	}
}

// The bounds the file puts on the hedge counts, which the core sizes
// memory by, let their limits through.
func TestHedgeBoundsAdmitTheirLimits(t *testing.T) {
	c, err := parse("policy.yaml", []byte("dependencies:\n  a: {reason: r, hedge: {window: 1048576, max_hedges: 16}}\n"))
	if err != nil {
		t.Fatalf("window 1<<20 and 16 hedges: %v; want them accepted", err)
	}
	if h := c.Dependencies[0].Hedge; h.Window != 1<<20 || h.MaxHedges != 16 {
		t.Errorf("hedge %+v", h)
	}
	if len(c.Warnings) != 1 || !strings.Contains(c.Warnings[0].Message, "is 16: a slow moment sends up to 17 copies") {
		t.Errorf("warnings %v; want the one about 16 hedges", c.Warnings)
	}
}

// The admin listing shows each dependency's hedging settings, and its
// throttler, whether an HTTP client or a policy holds them.
func TestAdminListsHedgesAndThrottlers(t *testing.T) {
	reg, err := New("policy.yaml", []byte(hedgeFile), Options{Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	st := reg.status()
	hedges := map[string]map[string]any{}
	for _, h := range st.Hedges {
		hedges[h.Dependency] = h.Settings
	}
	want := map[string]any{"delay": "fixed 20ms", "max_hedges": "1", "overload_pause": "10s"}
	for _, dep := range []string{"slow", "ledger"} {
		if !reflect.DeepEqual(hedges[dep], want) {
			t.Errorf("%s's hedge is listed as %v; want %v", dep, hedges[dep], want)
		}
	}
	if want := (map[string]any{"delay": "adaptive, no floor", "percentile": "0.9", "window": "1000", "max_hedges": "1", "overload_pause": "10s"}); !reflect.DeepEqual(hedges["stock"], want) {
		t.Errorf("stock's hedge is listed as %v; want %v", hedges["stock"], want)
	}
	if _, ok := hedges["api"]; ok || len(st.Hedges) != 3 {
		t.Errorf("hedges listed: %+v; want slow, ledger and stock only", st.Hedges)
	}
	var deps []string
	for _, th := range st.Throttlers {
		deps = append(deps, th.Dependency)
		if th.Dependency == "ledger" && (th.Settings["window"] != "2m0s" || th.Settings["k"] != 2.0 || th.Requests != 0 || th.RejectProbability != 0) {
			t.Errorf("ledger's throttler is listed as %+v; want the defaults, nothing counted", th)
		}
	}
	if !reflect.DeepEqual(deps, []string{"api", "stock", "ledger"}) { // HTTP, gRPC, then policy dependencies
		t.Errorf("throttlers listed for %v; want [api stock ledger]", deps)
	}
	g, _ := reg.GRPC("stock")
	if s := g.Current(); s.Throttler == nil || !reflect.DeepEqual(s.Hedge, &guardrail.HedgeConfig{Percentile: 0.9}) || s.Throttle.K != 3 {
		t.Errorf("stock's settings: throttler %v, hedge %+v, throttle %+v; want a throttler, percentile 0.9, k 3", s.Throttler, s.Hedge, s.Throttle)
	}
}

// A window far past the bound is refused without being allocated: the
// core's Validate builds the window it checks, and 1<<31 latencies are
// 32 GiB.
func TestHugeHedgeWindowIsNotAllocated(t *testing.T) {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := parse("policy.yaml", []byte("dependencies:\n  a: {reason: r, hedge: {window: 2147483647}}\n"))
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "dependencies.a.hedge.window: is 2147483647; want at most 1048576") {
		t.Errorf("window 2147483647: %v; want it refused", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
		t.Errorf("checking the file allocated %d MiB; want no window of that size", grew>>20)
	}
}
