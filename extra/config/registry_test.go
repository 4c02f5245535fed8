package config

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

const testFile = `
defaults:
  max_attempts: 3
  backoff: {strategy: none}
  retry_budget: {ratio: 0.5, max: 100}
dependencies:
  svc:
    reason: "tests"
    attempt_timeout: 2s
    response_header_timeout: 1s
    breaker: {min_requests: 5, failure_rate: 0.9}
    bulkhead: {max_concurrent: 200}
  other:
    reason: "tests"
    max_attempts: 1
  ledger:
    kind: policy
    reason: "tests"
    idempotent: true
    attempt_timeout: 1s
    breaker: {min_requests: 4, open_for: 1m}
    bulkhead: {max_concurrent: 3}
    deadline: 5s
servers:
  api:
    deadline: {max: 2s}
    shed: {limit: 100}
`

// counting serves 503 to every request when failing is set, else 200, and
// counts what it saw.
type counting struct {
	hits    atomic.Int64
	failing atomic.Bool
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.hits.Add(1)
	if c.failing.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	io.WriteString(w, "ok")
}

func newServer(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(h) // listens on 127.0.0.1
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, c *http.Client, url string) (int, error) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// The client a file configures is the client built by hand from the same
// numbers: same Config, and the same attempts seen by a failing server.
func TestHTTPClientEqualsHandBuilt(t *testing.T) {
	reg, err := New("policy.yaml", []byte(testFile), Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, dl, err := reg.HTTPConfig("svc")
	if err != nil {
		t.Fatal(err)
	}
	hand := guardhttp.Config{
		Name: "svc",
		Retry: guardrail.Retry{
			MaxAttempts:    3,
			AttemptTimeout: 2 * time.Second,
			Backoff:        backoff.None(),
		},
		ResponseHeaderTimeout: time.Second,
		Bulkhead:              &bulkhead.Config{MaxConcurrent: 200},
	}
	if dl != 0 {
		t.Errorf("deadline %v; want none", dl)
	}
	plain := got
	plain.Budget, plain.Breakers, plain.Observer = nil, nil, nil
	if !reflect.DeepEqual(plain, hand) {
		t.Errorf("the file's Config\n%+v\nis not the one built by hand\n%+v", plain, hand)
	}
	if m := got.Budget.Max(); m != 100 {
		t.Errorf("budget max %v; want 100", m)
	}
	wantBreaker := breaker.Config{Name: "h", MinRequests: 5, FailureRate: 0.9}
	handBreaker, _ := breaker.New(wantBreaker)
	if g, w := comparable(got.Breakers.Get("h").Config()), comparable(handBreaker.Config()); g != w {
		t.Errorf("breaker settings %s; by hand %s", g, w)
	}

	// Behaviour: a server failing every request sees the same attempts.
	srv := &counting{}
	srv.failing.Store(true)
	ts := newServer(t, srv)
	client, _ := reg.HTTPClient("svc")
	b, _ := budget.New(budget.Config{Ratio: 0.5, Max: 100})
	g, _ := breaker.NewGroup(breaker.GroupConfig{Config: breaker.Config{MinRequests: 5, FailureRate: 0.9}})
	hand.Budget, hand.Breakers = b, g
	handClient, err := guardhttp.NewClient(hand)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []*http.Client{client, handClient} {
		srv.hits.Store(0)
		code, err := get(t, c, ts.URL)
		if err != nil || code != http.StatusServiceUnavailable {
			t.Fatalf("got %d, %v; want 503", code, err)
		}
		if n := srv.hits.Load(); n != 3 {
			t.Errorf("the server saw %d attempts; want 3", n)
		}
	}
}

// comparable renders a breaker.Config without its functions.
func comparable(c breaker.Config) string {
	c.Name, c.Observer, c.Rand, c.Classify = "", nil, nil, nil
	return fmt.Sprintf("%+v", c)
}

// A policy dependency is the guardrail.Policy built by hand.
func TestPolicyEqualsHandBuilt(t *testing.T) {
	reg, err := New("policy.yaml", []byte(testFile), Options{})
	if err != nil {
		t.Fatal(err)
	}
	h, err := reg.Policy("ledger")
	if err != nil {
		t.Fatal(err)
	}
	p := h.Policy()
	if p.MaxAttempts != 3 || p.AttemptTimeout != time.Second || !p.Idempotent || p.Backoff != backoff.None() || h.cur.Load().deadline != 5*time.Second {
		t.Errorf("policy %+v, deadline %v; want 3 attempts of 1s, idempotent, no backoff, deadline 5s", p, h.cur.Load().deadline)
	}
	handBreaker, _ := breaker.New(breaker.Config{MinRequests: 4, OpenFor: time.Minute})
	if g, w := comparable(p.Breaker.Config()), comparable(handBreaker.Config()); g != w {
		t.Errorf("breaker settings %s; by hand %s", g, w)
	}
	if p.Bulkhead.Limit() != 3 {
		t.Errorf("bulkhead limit %d; want 3", p.Bulkhead.Limit())
	}
	hb, _ := budget.New(budget.Config{Ratio: 0.5, Max: 100})
	hbk, _ := bulkhead.New(bulkhead.Config{MaxConcurrent: 3})
	hand := &guardrail.Policy{Name: "ledger", Retry: guardrail.Retry{
		MaxAttempts:    3,
		AttemptTimeout: time.Second,
		Backoff:        backoff.None(),
		Budget:         hb,
	},
		Idempotent: true,
		Breaker:    handBreaker, Bulkhead: hbk}
	fail := errors.New("down")
	for _, run := range []func(op func(context.Context) (int, error)) error{
		func(op func(context.Context) (int, error)) error {
			_, err := do(context.Background(), h, op)
			return err
		},
		func(op func(context.Context) (int, error)) error {
			_, err := guardrail.Do(context.Background(), hand, op)
			return err
		},
	} {
		n := 0
		err := run(func(context.Context) (int, error) { n++; return 0, fail })
		if !errors.Is(err, fail) || n != 3 {
			t.Errorf("got %v after %d attempts; want the failure after 3", err, n)
		}
	}
}

func TestLookupsOfUnknownNames(t *testing.T) {
	reg, err := New("policy.yaml", []byte(testFile), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.HTTPClient("ledger"); !errors.Is(err, ErrUnknown) {
		t.Errorf("HTTPClient of a policy dependency: %v; want ErrUnknown", err)
	}
	if _, err := reg.Policy("nope"); !errors.Is(err, ErrUnknown) {
		t.Errorf("Policy(nope): %v; want ErrUnknown", err)
	}
	if _, err := reg.Shedder("api"); err != nil {
		t.Error(err)
	}
	if _, err := reg.Deadline("api"); err != nil {
		t.Error(err)
	}
}

// writeFile writes data to path with a modification time distinct from
// the last one, so that a poll sees the change even on a coarse clock.
func writeFile(t *testing.T, path, data string, mod time.Time) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, mod, mod); err != nil {
		t.Fatal(err)
	}
}

// A reload under 100 concurrent callers loses no call and keeps the state
// of the breakers and budgets whose settings did not change.
func TestReloadUnderLoad(t *testing.T) {
	srv := &counting{}
	ts := newServer(t, srv)
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, testFile, time.Unix(1e9, 0))
	var logs bytes.Buffer
	var logMu sync.Mutex
	logger := slog.New(slog.NewTextHandler(&lockedWriter{w: &logs, mu: &logMu}, nil))
	var results []ReloadResult
	var resMu sync.Mutex
	reg, err := Load(path, Options{Logger: logger, OnReload: func(r ReloadResult) {
		resMu.Lock()
		results = append(results, r)
		resMu.Unlock()
	}})
	if err != nil {
		t.Fatal(err)
	}
	client, _ := reg.HTTPClient("svc")
	before, _, _ := reg.HTTPConfig("svc")
	ledger, _ := reg.Policy("ledger")
	ledgerBreaker := ledger.Policy().Breaker
	ledgerBreaker.ForceOpen()

	const callers, calls = 100, 20
	var failed atomic.Int64
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			for range calls {
				resp, err := client.Get(ts.URL)
				if err != nil {
					failed.Add(1)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					failed.Add(1)
				}
			}
		}()
	}
	close(start)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	// Reload while the callers run, until they are done (at least 10
	// times): attempt timeouts change (a new Transport), breaker and budget
	// settings do not; every fifth file is broken.
	applied, rejected := 0, 0
	var last time.Duration
	for i := 0; ; i++ {
		select {
		case <-finished:
		default:
			i = min(i, 5) // keep reloading while the callers run
		}
		if i >= 10 {
			break
		}
		data := strings.Replace(testFile, "attempt_timeout: 2s", fmt.Sprintf("attempt_timeout: %ds", 2+(applied+rejected)%2), 1)
		bad := (applied+rejected)%5 == 4
		if bad {
			data = strings.Replace(data, "max_attempts: 3", "max_attempts: three", 1)
		}
		err := reg.ReloadBytes([]byte(data))
		if (err != nil) != bad {
			t.Fatalf("reload %d: %v", applied+rejected, err)
		}
		if bad {
			rejected++
		} else {
			applied++
			last = time.Duration(2+(applied+rejected-1)%2) * time.Second
		}
	}
	t.Logf("%d reloads applied and %d rejected under %d callers", applied, rejected, callers)
	wg.Wait()
	if n := failed.Load(); n != 0 {
		t.Errorf("%d calls failed across the reloads; want none", n)
	}
	if n := srv.hits.Load(); n != callers*calls {
		t.Errorf("the server saw %d calls; want %d", n, callers*calls)
	}
	after, _, _ := reg.HTTPConfig("svc")
	if after.Breakers != before.Breakers || after.Budget != before.Budget {
		t.Error("a reload that left the breaker and budget settings alone replaced them")
	}
	if after.AttemptTimeout != last {
		t.Errorf("attempt timeout %v after the last reload; want %v", after.AttemptTimeout, last)
	}
	if ledger.Policy().Breaker != ledgerBreaker || ledgerBreaker.State() != breaker.Open {
		t.Error("the ledger breaker, forced open, did not survive the reloads")
	}
	st := reg.Stats()
	if st.Applied != uint64(applied) || st.Rejected != uint64(rejected) || rejected == 0 {
		t.Errorf("stats %+v; want %d applied, %d rejected", st, applied, rejected)
	}
	logMu.Lock()
	if !strings.Contains(logs.String(), "reload rejected") || !strings.Contains(logs.String(), `max_attempts: is \"three\"`) {
		t.Errorf("no log line of the rejected reload naming its field:\n%s", logs.String())
	}
	logMu.Unlock()
	resMu.Lock()
	if len(results) != applied+rejected || !errors.Is(results[4].Err, ErrInvalidConfig) {
		t.Errorf("OnReload heard %d reloads, the 5th with %v; want %d, the 5th invalid", len(results), results[4].Err, applied+rejected)
	}
	resMu.Unlock()

	// Settings that change replace the breaker: its thresholds are new.
	if err := reg.ReloadBytes([]byte(strings.Replace(testFile, "failure_rate: 0.9", "failure_rate: 0.8", 1))); err != nil {
		t.Fatal(err)
	}
	if c, _, _ := reg.HTTPConfig("svc"); c.Breakers == before.Breakers {
		t.Error("new breaker settings kept the old breakers")
	}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// Watch reloads a file whose modification time changed; an invalid file
// leaves the settings in force.
func TestWatchReloadsChangedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, testFile, time.Unix(1e9, 0))
	done := make(chan ReloadResult, 10)
	reg, err := Load(path, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), OnReload: func(r ReloadResult) { done <- r }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg.Watch(ctx, 5*time.Millisecond)
	writeFile(t, path, strings.Replace(testFile, "max_attempts: 1", "max_attempts: 2", 1), time.Unix(1e9+1, 0))
	select {
	case r := <-done:
		if r.Err != nil || !contains(r.Changed, "other") {
			t.Fatalf("reload: %+v; want other changed", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reload 10 s after the file changed")
	}
	if c, _, _ := reg.HTTPConfig("other"); c.MaxAttempts != 2 {
		t.Errorf("max attempts %d; want 2", c.MaxAttempts)
	}
	writeFile(t, path, "dependencies: [", time.Unix(1e9+2, 0))
	select {
	case r := <-done:
		if r.Err == nil {
			t.Fatal("an invalid file was applied")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reload 10 s after the file changed")
	}
	if c, _, _ := reg.HTTPConfig("other"); c.MaxAttempts != 2 {
		t.Errorf("max attempts %d after an invalid file; want 2, the settings in force", c.MaxAttempts)
	}
}

// The server-side handles follow reloads.
func TestServerHandlesFollowReload(t *testing.T) {
	reg, err := New("policy.yaml", []byte(testFile), Options{})
	if err != nil {
		t.Fatal(err)
	}
	dl, _ := reg.Deadline("api")
	sh, _ := reg.Shedder("api")
	var left time.Duration
	h := dl.Middleware(sh.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d, _ := r.Context().Deadline()
		left = time.Until(d)
	})))
	ts := newServer(t, h)
	if code, err := get(t, http.DefaultClient, ts.URL); err != nil || code != 200 {
		t.Fatal(code, err)
	}
	if left > 2*time.Second || left < time.Second {
		t.Errorf("time left %v; want under the 2s max", left)
	}
	oldShed := sh.Current()
	if err := reg.ReloadBytes([]byte(strings.Replace(testFile, "max: 2s", "max: 8s", 1))); err != nil {
		t.Fatal(err)
	}
	if code, err := get(t, http.DefaultClient, ts.URL); err != nil || code != 200 {
		t.Fatal(code, err)
	}
	if left < 5*time.Second {
		t.Errorf("time left %v after the reload; want near the new 8s max", left)
	}
	if sh.Current() != oldShed {
		t.Error("the shedder, whose settings did not change, was replaced")
	}
	if st := oldShed.Stats(); st.Admitted != 2 {
		t.Errorf("the shedder admitted %d; want 2 across the reload", st.Admitted)
	}
}

// SIGHUP reloads the file, when asked for.
func TestWatchSignalReloadsOnSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, testFile, time.Unix(1e9, 0))
	done := make(chan ReloadResult, 10)
	reg, err := Load(path, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), OnReload: func(r ReloadResult) { done <- r }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg.WatchSignal(ctx)
	writeFile(t, path, strings.Replace(testFile, "max_attempts: 1", "max_attempts: 2", 1), time.Unix(1e9, 0))
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.Err != nil || !contains(r.Changed, "other") {
			t.Fatalf("reload: %+v; want other changed", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reload 10 s after SIGHUP")
	}
}

// The idempotency section builds a working middleware on the store the
// code gives, and a reload rebuilds it on the same store.
func TestIdempotencyFollowsReload(t *testing.T) {
	file := testFile + "    idempotency: {scope: single_tenant, ttl: 1h}\n"
	reg, err := New("policy.yaml", []byte(file), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Idempotency("api", store, func(*http.Request) (string, error) { return "x", nil }); err == nil {
		t.Error("a Scope function for a single_tenant file was accepted")
	}
	keys, err := reg.Idempotency("api", store, nil)
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	ts := newServer(t, keys.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		io.WriteString(w, "charged")
	})))
	post := func() string {
		req, _ := http.NewRequest(http.MethodPost, ts.URL, strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", "k1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.Header.Get("Idempotent-Replayed")
	}
	post()
	old := keys.Current()
	if err := reg.ReloadBytes([]byte(strings.Replace(file, "ttl: 1h", "ttl: 2h", 1))); err != nil {
		t.Fatal(err)
	}
	if keys.Current() == old {
		t.Error("the reload did not rebuild the idempotency middleware")
	}
	if got := post(); got != "true" || runs.Load() != 1 {
		t.Errorf("a retry after the reload: replayed %q, handler ran %d times; want a replay from the same store, 1 run", got, runs.Load())
	}
}

// A dependency's deadline bounds the whole request, and the server hears
// of it.
func TestHTTPDeadlineBoundsTheRequest(t *testing.T) {
	file := strings.Replace(testFile, "    max_attempts: 1\n", "    max_attempts: 1\n    deadline: 300ms\n", 1)
	reg, err := New("policy.yaml", []byte(file), Options{})
	if err != nil {
		t.Fatal(err)
	}
	announced := make(chan string, 1)
	ts := newServer(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		announced <- r.Header.Get("X-Request-Timeout")
		<-r.Context().Done() // hangs until the client gives up
	}))
	client, _ := reg.HTTPClient("other")
	start := time.Now()
	_, err = client.Get(ts.URL)
	if took := time.Since(start); err == nil || took > 5*time.Second {
		t.Fatalf("a hanging server: %v after %v; want an error at the 300ms deadline", err, took)
	}
	if ms, err := strconv.Atoi(<-announced); err != nil || ms > 300 || ms < 1 {
		t.Errorf("X-Request-Timeout %d (%v); want at most 300 ms", ms, err)
	}
	// A response in time is read whole: the deadline ends with its body.
	ok := newServer(t, &counting{})
	resp, err := client.Get(ok.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(body) != "ok" {
		t.Errorf("body %q, %v; want ok", body, err)
	}
}

// A budget whose settings did not change keeps its tokens across a
// reload; one whose settings changed starts full.
func TestReloadKeepsBudgetTokens(t *testing.T) {
	reg, err := New("policy.yaml", []byte(testFile), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ledger, _ := reg.Policy("ledger")
	b := ledger.Policy().Budget
	for range 40 {
		b.TryRetry()
	}
	if err := reg.ReloadBytes([]byte(strings.Replace(testFile, "attempt_timeout: 1s", "attempt_timeout: 2s", 1))); err != nil {
		t.Fatal(err)
	}
	if got := ledger.Policy(); got.AttemptTimeout != 2*time.Second || got.Budget != b || b.Tokens() != 60 {
		t.Errorf("after a reload of the attempt timeout: timeout %v, same budget %v, %v tokens; want 2s, the same budget, 60 tokens",
			got.AttemptTimeout, got.Budget == b, b.Tokens())
	}
	if err := reg.ReloadBytes([]byte(strings.Replace(testFile, "max: 100}", "max: 50}", 1))); err != nil {
		t.Fatal(err)
	}
	if nb := ledger.Policy().Budget; nb == b || nb.Tokens() != 50 {
		t.Errorf("after a reload of the budget: %v tokens; want a new budget, full at 50", nb.Tokens())
	}
}

// reloadCounter counts the event.ConfigReload events by outcome, as the
// metrics adapters do for guardrail_config_reloads_total.
type reloadCounter struct {
	mu     sync.Mutex
	counts map[string]int
	last   event.Event
}

func (c *reloadCounter) Observe(ctx context.Context, e event.Event) context.Context {
	if e.Kind == event.ConfigReload {
		c.mu.Lock()
		c.counts[e.Outcome]++
		c.last = e
		c.mu.Unlock()
	}
	return ctx
}

func (c *reloadCounter) get() (ok, failed int, last event.Event) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[event.OutcomeOK], c.counts[event.OutcomeError], c.last
}

// Every reload attempt reaches the Observer: a rejected one as
// OutcomeError with its error, leaving the settings in force; an applied
// one as OutcomeOK. Building the Registry is not a reload.
func TestReloadReportsOutcomeToObserver(t *testing.T) {
	path := filepath.Join(t.TempDir(), "policy.yaml")
	writeFile(t, path, testFile, time.Unix(1e9, 0))
	obs := &reloadCounter{counts: map[string]int{}}
	reg, err := Load(path, Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	if ok, failed, _ := obs.get(); ok != 0 || failed != 0 {
		t.Fatalf("after Load: ok %d, error %d; want no reload counted", ok, failed)
	}

	invalid := strings.Replace(testFile, "max_attempts: 1", "max_attempts: -1", 1)
	if err := reg.ReloadBytes([]byte(invalid)); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("ReloadBytes(invalid) = %v; want ErrInvalidConfig", err)
	}
	ok, failed, last := obs.get()
	if ok != 0 || failed != 1 {
		t.Fatalf("after an invalid reload: ok %d, error %d; want 0, 1", ok, failed)
	}
	if last.Err == nil || !strings.Contains(last.Err.Error(), "max_attempts") || last.Detail != path {
		t.Errorf("rejected reload event: Err %v, Detail %q; want the error naming max_attempts and the file", last.Err, last.Detail)
	}
	if last.Dependency != "" || last.Operation != "" {
		t.Errorf("reload event has Dependency %q, Operation %q; want none", last.Dependency, last.Operation)
	}
	if c, _, _ := reg.HTTPConfig("other"); c.MaxAttempts != 1 {
		t.Errorf("max attempts %d after an invalid reload; want 1, the settings in force", c.MaxAttempts)
	}

	writeFile(t, path, strings.Replace(testFile, "max_attempts: 1", "max_attempts: 2", 1), time.Unix(1e9+1, 0))
	if err := reg.Reload(); err != nil {
		t.Fatal(err)
	}
	ok, failed, last = obs.get()
	if ok != 1 || failed != 1 || last.Outcome != event.OutcomeOK || last.Err != nil {
		t.Fatalf("after a valid reload: ok %d, error %d, last %+v; want 1, 1, ok", ok, failed, last)
	}
	if c, _, _ := reg.HTTPConfig("other"); c.MaxAttempts != 2 {
		t.Errorf("max attempts %d after a valid reload; want 2", c.MaxAttempts)
	}

	// A file that cannot be read is a rejected reload too.
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := reg.Reload(); err == nil {
		t.Fatal("Reload of a removed file succeeded")
	}
	if ok, failed, _ = obs.get(); ok != 1 || failed != 2 {
		t.Errorf("after reading a removed file: ok %d, error %d; want 1, 2", ok, failed)
	}
	if st := reg.Stats(); st.Applied != 1 || st.Rejected != 2 {
		t.Errorf("Stats %+v; want 1 applied, 2 rejected, as the events say", st)
	}
}

// consecutive_failures reaches the breakers of both kinds of dependency:
// a policy's breaker opens on that run of failures below min_requests, and
// an HTTP client's group builds its breakers with it. A reload that drops
// it turns it off.
func TestConsecutiveFailuresFromFile(t *testing.T) {
	file := strings.Replace(testFile, "breaker: {min_requests: 4, open_for: 1m}", "breaker: {min_requests: 100, open_for: 1m, consecutive_failures: 3}", 1)
	file = strings.Replace(file, "breaker: {min_requests: 5, failure_rate: 0.9}", "breaker: {min_requests: 5, failure_rate: 0.9, consecutive_failures: 7}", 1)
	reg, err := New("policy.yaml", []byte(file), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	hc, _, err := reg.HTTPConfig("svc")
	if err != nil {
		t.Fatal(err)
	}
	if n := hc.Breakers.Get("10.0.0.7:443").Config().ConsecutiveFailures; n != 7 {
		t.Errorf("svc's breaker group: ConsecutiveFailures %d; want 7", n)
	}
	p, err := reg.Policy("ledger")
	if err != nil {
		t.Fatal(err)
	}
	if n := p.Policy().Breaker.Config().ConsecutiveFailures; n != 3 {
		t.Fatalf("ledger's breaker: ConsecutiveFailures %d; want 3", n)
	}
	calls := 0
	_, err = do(context.Background(), p, func(context.Context) (int, error) {
		calls++
		return 0, guardrail.Transient(errors.New("503"))
	})
	if err == nil || calls != 3 {
		t.Fatalf("call: %d attempts, err %v; want 3 failed attempts", calls, err)
	}
	if st := p.Policy().Breaker.State(); st != breaker.Open {
		t.Fatalf("ledger's breaker is %v after 3 failures in a row; want open (min_requests is 100)", st)
	}

	if err := reg.ReloadBytes([]byte(testFile)); err != nil {
		t.Fatal(err)
	}
	if n := p.Policy().Breaker.Config().ConsecutiveFailures; n != 0 {
		t.Errorf("after a reload without it: ConsecutiveFailures %d; want 0 (off)", n)
	}
}

// A server's rate_limit section builds a per-client limiter charged by the
// key function the code passes; a reload that changes it rebuilds the
// limiter, one that does not keeps its buckets, and an invalid value is
// an error on its line.
func TestRateLimiterFromFile(t *testing.T) {
	file := strings.Replace(testFile, "    shed: {limit: 100}\n", "    shed: {limit: 100}\n    rate_limit: {rate: 1, burst: 2}\n", 1)
	reg, err := New("policy.yaml", []byte(file), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.RateLimiter("nope", nil); !errors.Is(err, ErrUnknown) {
		t.Errorf("RateLimiter(nope) = %v; want ErrUnknown", err)
	}
	byHeader := func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil }
	rl, err := reg.RateLimiter("api", byHeader)
	if err != nil {
		t.Fatal(err)
	}
	var served atomic.Int32
	h := rl.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Add(1) }))
	send := func(client string) int {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Client", client)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	// The rate is one a second: within this test no token comes back.
	for i, want := range []int{200, 200, 429} {
		if got := send("a"); got != want {
			t.Errorf("client a, request %d: %d; want %d", i+1, got, want)
		}
	}
	if got := send("b"); got != 200 {
		t.Errorf("client b, first request: %d; want 200 (its own bucket)", got)
	}
	if served.Load() != 3 {
		t.Errorf("handler ran %d times; want 3", served.Load())
	}

	// Same section: the buckets stay, a spent client stays refused.
	if err := reg.ReloadBytes([]byte(strings.Replace(file, "max_attempts: 1", "max_attempts: 2", 1))); err != nil {
		t.Fatal(err)
	}
	if got := send("a"); got != 429 {
		t.Errorf("client a after an unrelated reload: %d; want 429 (buckets kept)", got)
	}
	// A new burst: a new limiter, full buckets.
	if err := reg.ReloadBytes([]byte(strings.Replace(file, "burst: 2", "burst: 5", 1))); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if got := send("a"); got != 200 {
			t.Fatalf("client a, request %d after burst went to 5: %d; want 200", i+1, got)
		}
	}
	if got := send("a"); got != 429 {
		t.Errorf("client a, sixth request: %d; want 429", got)
	}

	bad := strings.Replace(file, "burst: 2", "burst: -1", 1)
	_, err = parse("policy.yaml", []byte(bad))
	var perr *Error
	if !errors.As(err, &perr) {
		t.Fatalf("parse(burst: -1) = %v; want an *Error", err)
	}
	line := strings.Count(bad[:strings.Index(bad, "burst: -1")], "\n") + 1
	found := false
	for _, d := range perr.Diagnostics {
		if d.Line == line && strings.Contains(d.String(), "servers.api.rate_limit.burst: is -1; want a positive count") {
			found = true
		}
	}
	if !found {
		t.Errorf("no error on line %d naming servers.api.rate_limit.burst; got:\n%v", line, err)
	}
}

// The report shows a rate limit's effective settings, defaults filled in.
func TestReportShowsRateLimit(t *testing.T) {
	file := strings.Replace(testFile, "    shed: {limit: 100}\n", "    shed: {limit: 100}\n    rate_limit: {rate: 2.5}\n", 1)
	c, err := parse("policy.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, s := range c.report().Servers {
		for _, e := range s.Effective {
			got[e.Key] = e.Value
		}
	}
	for k, want := range map[string]string{"rate_limit.rate": "2.5", "rate_limit.burst": "3", "rate_limit.max_keys": "100000"} {
		if got[k] != want {
			t.Errorf("%s = %q; want %q", k, got[k], want)
		}
	}
}

// A reload of the same file changes nothing, whatever the file holds:
// settings are compared by value, so an unlimited budget, a hedge, a
// bulkhead, idempotent methods or shed shares, which are new values at
// every parse, keep what was built from them.
func TestReloadOfTheSameFileChangesNothing(t *testing.T) {
	const file = `
dependencies:
  web:
    reason: "tests"
    retry_budget: {unlimited: true}
    bulkhead: {max_concurrent: 4}
    hedge: {delay: 10ms}
    throttle: {k: 2}
  stock:
    kind: grpc
    reason: "tests"
    idempotent_methods: [/inventory.v1.Stock/]
    retry_budget: {unlimited: true}
    bulkhead: {max_concurrent: 4}
    hedge: {}
    throttle: {}
  ledger:
    kind: policy
    reason: "tests"
    idempotent: true
    retry_budget: {unlimited: true}
    bulkhead: {max_concurrent: 4}
    deadline: 1s
servers:
  api:
    deadline: {max: 5s}
    shed: {limit: 10, shares: {high: 0.5}}
    rate_limit: {rate: 10}
`
	var results []ReloadResult
	reg, err := New("policy.yaml", []byte(file), Options{Logger: quiet(), OnReload: func(r ReloadResult) { results = append(results, r) }})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.RateLimiter("api", nil); err != nil {
		t.Fatal(err)
	}
	ledger, _ := reg.Policy("ledger")
	p := ledger.Policy()
	if err := reg.ReloadBytes([]byte(file)); err != nil {
		t.Fatal(err)
	}
	if len(results) != 1 || len(results[0].Changed) != 0 {
		t.Errorf("a reload of the same file: %+v; want one result, nothing changed", results)
	}
	if ledger.Policy() != p {
		t.Error("a reload of the same file replaced the policy")
	}
}

// WithDeadline bounds a call by the dependency's deadline, and leaves the
// context alone when the file sets none.
func TestPolicyHandleWithDeadline(t *testing.T) {
	reg := quietRegistry(t, `
dependencies:
  bounded: {kind: policy, reason: "tests", deadline: 2s}
  free: {kind: policy}
`)
	ctx := context.Background()
	bounded, _ := reg.Policy("bounded")
	bctx, cancel := bounded.WithDeadline(ctx)
	dl, ok := bctx.Deadline()
	if !ok || time.Until(dl) > 2*time.Second {
		t.Errorf("deadline %v, %v; want one within 2s", dl, ok)
	}
	cancel()
	if bctx.Err() == nil {
		t.Error("cancel did not release the bounded context")
	}
	free, _ := reg.Policy("free")
	fctx, cancel := free.WithDeadline(ctx)
	defer cancel()
	if fctx != ctx {
		t.Error("a dependency without a deadline changed the context")
	}
}

// A policy file sets the per-caller quota of idempotency keys and the
// IPv6 prefix a rate limit charges by.
func TestQuotaAndPrefixFromFile(t *testing.T) {
	file := strings.Replace(testFile, "    shed: {limit: 100}\n",
		"    shed: {limit: 100}\n    rate_limit: {rate: 1, burst: 1, ipv6_prefix_bits: 48}\n"+
			"    idempotency: {scope: caller, max_keys_per_scope: 1}\n", 1)
	reg, err := New("policy.yaml", []byte(file), Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	rl, err := reg.RateLimiter("api", nil)
	if err != nil {
		t.Fatal(err)
	}
	limited := rl.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	var codes []int
	for _, addr := range []string{"[2001:db8:1:1::1]:1000", "[2001:db8:1:2::1]:1000"} { // one /48, two /64s
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = addr
		w := httptest.NewRecorder()
		limited.ServeHTTP(w, req)
		codes = append(codes, w.Code)
	}
	if codes[0] != 200 || codes[1] != 429 {
		t.Errorf("two /64s of one /48 at burst 1: %v; want [200 429], one bucket per /48", codes)
	}

	store, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	keys, err := reg.Idempotency("api", store, func(*http.Request) (string, error) { return "alice", nil })
	if err != nil {
		t.Fatal(err)
	}
	h := keys.Middleware(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(201) }))
	codes = codes[:0]
	for _, key := range []string{"k1", "k2"} {
		req := httptest.NewRequest("POST", "/pay", strings.NewReader("{}"))
		req.Header.Set("Idempotency-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		codes = append(codes, w.Code)
	}
	if codes[0] != 201 || codes[1] != 429 {
		t.Errorf("two new keys of one caller at max_keys_per_scope 1: %v; want [201 429]", codes)
	}
}
