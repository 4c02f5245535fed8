package idempotency_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// counter is a handler that counts its runs and answers "run N".
type counter struct {
	runs   atomic.Int32
	status int
	header http.Header
}

func (c *counter) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := c.runs.Add(1)
	body, _ := io.ReadAll(r.Body)
	for k, vs := range c.header {
		w.Header()[k] = vs
	}
	status := c.status
	if status == 0 {
		status = http.StatusCreated
	}
	w.WriteHeader(status)
	fmt.Fprintf(w, "run %d body %s", n, body)
}

// events records the middleware's events by reason.
type events struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *events) Observe(ctx context.Context, ev event.Event) context.Context {
	if ev.Kind != event.Idempotency {
		panic("unexpected event kind " + ev.Kind.String())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[ev.Reason]++
	return ctx
}

func (e *events) count(reason string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[reason]
}

type request struct {
	method, target, key, body, principal string
	keys                                 []string // several Idempotency-Key fields
	ctx                                  context.Context
}

func serve(h http.Handler, rq request) *httptest.ResponseRecorder {
	if rq.method == "" {
		rq.method = http.MethodPost
	}
	if rq.target == "" {
		rq.target = "/payments"
	}
	req := httptest.NewRequest(rq.method, rq.target, strings.NewReader(rq.body))
	if rq.ctx != nil {
		req = req.WithContext(rq.ctx)
	}
	if rq.key != "" {
		req.Header.Set(idempotency.HeaderKey, rq.key)
	}
	for _, k := range rq.keys {
		req.Header.Add(idempotency.HeaderKey, k)
	}
	if rq.principal != "" {
		req.Header.Set("X-User", rq.principal)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// middleware returns the Server's Middleware for a test; a Config that sets
// no scope is single-tenant, which is what a test with one caller means.
func middleware(store idempotency.Store, cfg idempotency.Config) func(http.Handler) http.Handler {
	if cfg.Scope == nil {
		cfg.SingleTenant = true
	}
	srv, err := idempotency.New(store, cfg)
	if err != nil {
		panic(err)
	}
	return srv.Middleware
}

// must returns v, and panics if err is not nil: for constructors given a
// Config known to be valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func quiet() *slog.Logger { return slog.New(slog.DiscardHandler) }

func newMW(cfg idempotency.Config, next http.Handler) http.Handler {
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	return middleware(must(memstore.New(memstore.Config{})), cfg)(next)
}

func byUser(r *http.Request) (string, error) {
	if u := r.Header.Get("X-User"); u != "" {
		return u, nil
	}
	return "", errors.New("not signed in")
}

func wantCode(t *testing.T, rec *httptest.ResponseRecorder, code int) {
	t.Helper()
	if rec.Code != code {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, code, rec.Body)
	}
}

func TestReplayIsByteForByteAndMarked(t *testing.T) {
	h := &counter{header: http.Header{"Location": {"/payments/1"}, "X-Multi": {"a", "b"}}}
	mw := newMW(idempotency.Config{}, h)
	first := serve(mw, request{key: "k1", body: `{"amount":1}`})
	wantCode(t, first, http.StatusCreated)
	if first.Header().Get(idempotency.HeaderReplayed) != "" {
		t.Error("first response marked as replayed")
	}
	again := serve(mw, request{key: "k1", body: `{"amount":1}`})
	wantCode(t, again, http.StatusCreated)
	if !bytes.Equal(again.Body.Bytes(), first.Body.Bytes()) {
		t.Errorf("replay body %q, want %q", again.Body, first.Body)
	}
	if got := again.Header().Get(idempotency.HeaderReplayed); got != "true" {
		t.Errorf("%s = %q, want true", idempotency.HeaderReplayed, got)
	}
	if got := again.Header()["X-Multi"]; len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Errorf("X-Multi = %q", got)
	}
	if got, want := again.Header().Get("Content-Length"), strconv.Itoa(first.Body.Len()); got != want {
		t.Errorf("Content-Length = %q, want %q", got, want)
	}
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestMethodsAndMissingKey(t *testing.T) {
	tests := []struct {
		name     string
		cfg      idempotency.Config
		method   string
		key      string
		wantCode int
		wantRuns int32 // after two identical requests
	}{
		{"GET passes through", idempotency.Config{Required: true}, http.MethodGet, "k", 201, 2},
		{"PUT passes through by default", idempotency.Config{}, http.MethodPut, "k", 201, 2},
		{"PUT when listed", idempotency.Config{Methods: []string{"PUT"}}, http.MethodPut, "k", 201, 1},
		{"PATCH by default", idempotency.Config{}, http.MethodPatch, "k", 201, 1},
		{"no key, optional", idempotency.Config{}, http.MethodPost, "", 201, 2},
		{"no key, required", idempotency.Config{Required: true}, http.MethodPost, "", 400, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &counter{}
			mw := newMW(tt.cfg, h)
			var rec *httptest.ResponseRecorder
			for range 2 {
				rec = serve(mw, request{method: tt.method, key: tt.key})
			}
			wantCode(t, rec, tt.wantCode)
			if n := h.runs.Load(); n != tt.wantRuns {
				t.Errorf("handler ran %d times, want %d", n, tt.wantRuns)
			}
		})
	}
}

func TestBadKeysGet400(t *testing.T) {
	tooLong := strings.Repeat("x", 65)
	for name, rq := range map[string]request{
		"two fields":      {keys: []string{"a", "b"}},
		"folded":          {key: "a, b"},
		"too long":        {key: tooLong},
		"bad char":        {key: "a b"},
		"unterminated":    {key: `"abc`},
		"not a uuid":      {key: "hello"},
		"params on key":   {key: `"3f0e0c52-5d4e-4a6e-9d1a-3b2b7c0f8e11";x=1`},
		"empty sf-string": {key: `""`},
	} {
		t.Run(name, func(t *testing.T) {
			h := &counter{}
			mw := newMW(idempotency.Config{MaxKeyLength: 64, ValidateKey: func(k string) error {
				if len(k) != 36 || strings.Count(k, "-") != 4 {
					return errors.New("the key must be a UUID")
				}
				return nil
			}}, h)
			rec := serve(mw, rq)
			wantCode(t, rec, http.StatusBadRequest)
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type = %q", ct)
			}
			var p struct {
				Title, Detail string
				Status        int
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != 400 || p.Detail == "" {
				t.Errorf("problem body %s: %v", rec.Body, err)
			}
			if h.runs.Load() != 0 {
				t.Error("handler ran for a bad key")
			}
		})
	}
}

func TestMismatchGets422(t *testing.T) {
	h := &counter{}
	mux := http.NewServeMux()
	mux.Handle("POST /orders/{id}/pay", newMW(idempotency.Config{DocsURL: "https://example.com/idempotency"}, h))
	wantCode(t, serve(mux, request{target: "/orders/1/pay", key: "k", body: "a"}), http.StatusCreated)
	for name, rq := range map[string]request{
		"other body":                 {target: "/orders/1/pay", key: "k", body: "b"},
		"other query":                {target: "/orders/1/pay?currency=usd", key: "k", body: "a"},
		"other resource, same route": {target: "/orders/2/pay", key: "k", body: "a"},
	} {
		t.Run(name, func(t *testing.T) {
			rec := serve(mux, rq)
			wantCode(t, rec, http.StatusUnprocessableEntity)
			if got := rec.Header().Get("Link"); got != `<https://example.com/idempotency>; rel="describedby"` {
				t.Errorf("Link = %q", got)
			}
			if !strings.Contains(rec.Body.String(), `"type":"https://example.com/idempotency"`) {
				t.Errorf("problem type missing: %s", rec.Body)
			}
		})
	}
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestScopes(t *testing.T) {
	h := &counter{}
	mux := http.NewServeMux()
	mw := middleware(must(memstore.New(memstore.Config{})), idempotency.Config{Scope: byUser, Logger: quiet()})
	mux.Handle("POST /payments", mw(h))
	mux.Handle("POST /refunds", mw(h))

	alice := serve(mux, request{key: "shared", body: "x", principal: "alice"})
	bob := serve(mux, request{key: "shared", body: "x", principal: "bob"})
	refund := serve(mux, request{target: "/refunds", key: "shared", body: "x", principal: "alice"})
	for _, rec := range []*httptest.ResponseRecorder{alice, bob, refund} {
		wantCode(t, rec, http.StatusCreated)
		if rec.Header().Get(idempotency.HeaderReplayed) != "" {
			t.Fatal("another scope's response was replayed")
		}
	}
	if n := h.runs.Load(); n != 3 {
		t.Fatalf("handler ran %d times, want 3 (one per principal and route)", n)
	}
	// Each replays its own.
	if got := serve(mux, request{key: "shared", body: "x", principal: "bob"}).Body.String(); got != bob.Body.String() {
		t.Errorf("bob's replay = %q, want %q", got, bob.Body)
	}
	if got := serve(mux, request{key: "shared", body: "x", principal: "alice"}).Body.String(); got != alice.Body.String() {
		t.Errorf("alice's replay = %q, want %q", got, alice.Body)
	}
	// A different payload from bob is bob's mismatch, not a new run.
	wantCode(t, serve(mux, request{key: "shared", body: "y", principal: "bob"}), http.StatusUnprocessableEntity)

	// A request Scope cannot attribute is refused, not looked up in a
	// shared scope, and runs nothing.
	wantCode(t, serve(mux, request{key: "shared", body: "x"}), http.StatusForbidden)
	empty := middleware(must(memstore.New(memstore.Config{})), idempotency.Config{Logger: quiet(),
		Scope: func(*http.Request) (string, error) { return "", nil }})(h)
	wantCode(t, serve(empty, request{key: "shared", body: "x"}), http.StatusForbidden)
	if n := h.runs.Load(); n != 3 {
		t.Errorf("handler ran %d times, want still 3", n)
	}
	// Without a key nothing is looked up, so nothing needs a scope.
	wantCode(t, serve(mux, request{body: "x"}), http.StatusCreated)
}

func TestNewRequiresAScope(t *testing.T) {
	store := must(memstore.New(memstore.Config{}))
	_, err := idempotency.New(store, idempotency.Config{})
	if !errors.Is(err, idempotency.ErrInvalidConfig) {
		t.Fatalf("New with a zero Config: %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"Config.Scope", "SingleTenant", "share one namespace", "replayed that caller's stored response"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	_, err = idempotency.New(store, idempotency.Config{SingleTenant: true, Scope: byUser})
	if !errors.Is(err, idempotency.ErrInvalidConfig) || !strings.Contains(err.Error(), "exactly one") {
		t.Errorf("New with both Scope and SingleTenant: %v", err)
	}
	for _, cfg := range []idempotency.Config{{SingleTenant: true}, {Scope: byUser}} {
		if _, err := idempotency.New(store, cfg); err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
		}
	}
}

func TestNewValidates(t *testing.T) {
	store := must(memstore.New(memstore.Config{}))
	tests := []struct {
		name string
		cfg  idempotency.Config
		want string
	}{
		{"MaxKeyLength", idempotency.Config{MaxKeyLength: -1}, "Config.MaxKeyLength is -1; want a positive length"},
		{"TTL", idempotency.Config{TTL: -time.Second}, "Config.TTL is -1s; want a positive duration"},
		{"Lease", idempotency.Config{Lease: -time.Second}, "Config.Lease is -1s"},
		{"StoreTimeout", idempotency.Config{StoreTimeout: -1}, "Config.StoreTimeout is -1ns"},
		{"RetryAfter", idempotency.Config{RetryAfter: -time.Second}, "Config.RetryAfter is -1s"},
		{"Methods empty", idempotency.Config{Methods: []string{}}, "Config.Methods is empty"},
		{"Methods malformed", idempotency.Config{Methods: []string{"POST", "BAD METHOD"}}, `Config.Methods[1] is "BAD METHOD"`},
		{"DocsURL", idempotency.Config{DocsURL: "/docs"}, `Config.DocsURL is "/docs"; want an absolute URL`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.cfg.SingleTenant = true
			_, err := idempotency.New(store, tt.cfg)
			if !errors.Is(err, idempotency.ErrInvalidConfig) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New: %v, want ErrInvalidConfig saying %q", err, tt.want)
			}
		})
	}
	// Negative size caps mean no limit, as documented.
	if _, err := idempotency.New(store, idempotency.Config{SingleTenant: true, MaxBodyBytes: -1, MaxResponseBytes: -1}); err != nil {
		t.Errorf("negative size caps: %v", err)
	}
	if _, err := idempotency.New(nil, idempotency.Config{SingleTenant: true}); err == nil {
		t.Error("New accepted a nil Store")
	}
}

func TestNameIsTheEventsDependency(t *testing.T) {
	var deps []string
	obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		deps = append(deps, e.Dependency)
		return ctx
	})
	mw := newMW(idempotency.Config{Name: "payments", Observer: obs}, &counter{})
	serve(mw, request{key: "k"})
	serve(mw, request{key: "k"})
	if want := []string{"payments", "payments"}; !slices.Equal(deps, want) {
		t.Errorf("dependencies %q, want %q", deps, want)
	}
}

func TestReleaseAndStoreRules(t *testing.T) {
	tests := []struct {
		status   int
		released bool
	}{
		{200, false}, {201, false}, {204, false}, {302, false},
		{400, false}, {404, false}, {409, false}, {422, false}, {499, false},
		{408, true}, {425, true}, {429, true},
		{500, true}, {501, true}, {502, true}, {503, true}, {504, true},
	}
	for _, tt := range tests {
		t.Run(strconv.Itoa(tt.status), func(t *testing.T) {
			h := &counter{status: tt.status}
			ev := &events{}
			mw := newMW(idempotency.Config{Observer: ev}, h)
			first := serve(mw, request{key: "k"})
			wantCode(t, first, tt.status)
			second := serve(mw, request{key: "k"})
			wantCode(t, second, tt.status)
			wantRuns, reason := int32(1), event.ReasonStored
			if tt.released {
				wantRuns, reason = 2, event.ReasonReleased
			}
			if n := h.runs.Load(); n != wantRuns {
				t.Errorf("handler ran %d times, want %d", n, wantRuns)
			}
			if ev.count(reason) == 0 {
				t.Errorf("no %q event; got %v", reason, ev.n)
			}
			if !tt.released && second.Header().Get(idempotency.HeaderReplayed) != "true" {
				t.Error("second response not replayed")
			}
		})
	}
}

// A 429 says the request was not processed: the key is released, so the
// retry with the same key, after Retry-After, reaches the handler again,
// and only the definite answer that follows is stored and replayed.
func TestTooManyRequestsReleasesTheKey(t *testing.T) {
	var runs atomic.Int32
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprint(w, "charged")
	})
	ev := &events{}
	mw := newMW(idempotency.Config{Observer: ev}, h)
	first := serve(mw, request{key: "k", body: "b"})
	wantCode(t, first, http.StatusTooManyRequests)
	if got := first.Header().Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After %q, want the handler's 3", got)
	}
	second := serve(mw, request{key: "k", body: "b"})
	wantCode(t, second, http.StatusCreated)
	if second.Header().Get(idempotency.HeaderReplayed) != "" {
		t.Error("the retry after a 429 was replayed; want it run")
	}
	third := serve(mw, request{key: "k", body: "b"})
	wantCode(t, third, http.StatusCreated)
	if third.Header().Get(idempotency.HeaderReplayed) != "true" || third.Body.String() != "charged" {
		t.Errorf("third: replayed %q body %q, want the stored 201 replayed", third.Header().Get(idempotency.HeaderReplayed), third.Body)
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2: once refused with 429, once charged", n)
	}
	if ev.count(event.ReasonReleased) != 1 || ev.count(event.ReasonStored) != 1 || ev.count(event.ReasonReplayed) != 1 {
		t.Errorf("events %v, want one released, one stored, one replayed", ev.n)
	}
}

// wantUnknown checks that rec is the replayed unknown-outcome answer.
func wantUnknown(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	wantCode(t, rec, http.StatusInternalServerError)
	if rec.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Error("the unknown outcome is not marked replayed")
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q, want a problem document", ct)
	}
	var p struct {
		Title  string
		Status int
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Status != 500 || !strings.Contains(p.Title, "Outcome unknown") {
		t.Errorf("body %s (%v), want the outcome-unknown problem", rec.Body, err)
	}
}

// servePanic serves rq and returns what the middleware re-raised.
func servePanic(h http.Handler, rq request) (v any) {
	defer func() { v = recover() }()
	serve(h, rq)
	return nil
}

// A handler that charges and then panics must not be run again by the
// retry: it may have committed.
func TestPanicRecordsUnknownOutcomeAndRepanics(t *testing.T) {
	var runs, charges atomic.Int32
	ev := &events{}
	mw := newMW(idempotency.Config{Observer: ev}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		charges.Add(1)
		panic("boom")
	}))
	if v := servePanic(mw, request{key: "k"}); v != "boom" {
		t.Errorf("recovered %v, want the handler's panic", v)
	}
	if ev.count(event.ReasonOutcomeUnknown) != 1 || ev.count(event.ReasonReleased) != 0 {
		t.Errorf("events %v, want one outcome_unknown and no release", ev.n)
	}
	for range 3 {
		wantUnknown(t, serve(mw, request{key: "k"}))
	}
	if n := charges.Load(); n != 1 {
		t.Errorf("charged %d times, want 1 (the retries must not run the handler)", n)
	}
	// Another payload with the key is still a mismatch.
	wantCode(t, serve(mw, request{key: "k", body: "other"}), http.StatusUnprocessableEntity)
	// net/http's own abort is re-raised unchanged too.
	abort := newMW(idempotency.Config{}, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) }))
	if v := servePanic(abort, request{key: "k"}); v != http.ErrAbortHandler {
		t.Errorf("recovered %v, want http.ErrAbortHandler", v)
	}
}

// A handler that knows it committed nothing releases its key, and the
// retry runs it.
func TestReleaseBeforePanicLetsTheRetryRun(t *testing.T) {
	var runs atomic.Int32
	ev := &events{}
	mw := newMW(idempotency.Config{Observer: ev}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if runs.Add(1) == 1 {
			if err := idempotency.Release(r.Context()); err != nil {
				t.Errorf("Release: %v", err)
			}
			panic("boom")
		}
		w.WriteHeader(http.StatusCreated)
	}))
	if v := servePanic(mw, request{key: "k"}); v != "boom" {
		t.Errorf("recovered %v, want the handler's panic", v)
	}
	if ev.count(event.ReasonReleased) != 1 || ev.count(event.ReasonOutcomeUnknown) != 0 {
		t.Errorf("events %v, want one release", ev.n)
	}
	wantCode(t, serve(mw, request{key: "k"}), http.StatusCreated)
	if got := serve(mw, request{key: "k"}); got.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Error("the retry's response was not stored")
	}
	if n := runs.Load(); n != 2 {
		t.Errorf("handler ran %d times, want 2 (the released panic, then the retry)", n)
	}
}

// Release also frees the key of a handler that answers: its response is
// sent but not stored.
func TestReleaseWithAResponse(t *testing.T) {
	var runs atomic.Int32
	mw := newMW(idempotency.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		idempotency.Release(r.Context())
		w.WriteHeader(http.StatusConflict)
	}))
	wantCode(t, serve(mw, request{key: "k"}), http.StatusConflict)
	rec := serve(mw, request{key: "k"})
	if rec.Header().Get(idempotency.HeaderReplayed) != "" || runs.Load() != 2 {
		t.Errorf("runs %d, replayed %q: want the released key run again", runs.Load(), rec.Header().Get(idempotency.HeaderReplayed))
	}
}

func TestReleaseOutsideAndAfter(t *testing.T) {
	if err := idempotency.Release(context.Background()); !errors.Is(err, idempotency.ErrNoLease) {
		t.Errorf("Release outside the middleware: %v, want ErrNoLease", err)
	}
	var kept context.Context
	mw := newMW(idempotency.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kept = r.Context()
	}))
	serve(mw, request{key: "k"})
	if err := idempotency.Release(kept); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("Release after the handler returned: %v, want ErrLeaseLost", err)
	}
}

// A request the middleware lets through unprotected needs no special case:
// Held, Confirm and Release return nil.
func TestUnprotectedRequestsNeedNoSpecialCase(t *testing.T) {
	check := func(t *testing.T) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ctx := r.Context()
			if err := errors.Join(idempotency.Held(ctx), idempotency.Confirm(ctx), idempotency.Release(ctx)); err != nil {
				t.Errorf("unprotected request: %v", err)
			}
			w.WriteHeader(http.StatusCreated)
		})
	}
	t.Run("no key", func(t *testing.T) {
		wantCode(t, serve(newMW(idempotency.Config{}, check(t)), request{}), http.StatusCreated)
	})
	t.Run("FailOpen", func(t *testing.T) {
		s := &fakeStore{begin: func(context.Context, string, idempotency.Fingerprint, time.Duration) (idempotency.Result, error) {
			return idempotency.Result{}, errors.New("down")
		}}
		wantCode(t, serve(middleware(s, idempotency.Config{Logger: quiet(), FailOpen: true})(check(t)), request{key: "k"}), http.StatusCreated)
	})
	t.Run("method passed through", func(t *testing.T) {
		mw := newMW(idempotency.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if err := idempotency.Confirm(r.Context()); !errors.Is(err, idempotency.ErrNoLease) {
				t.Errorf("GET: %v, want ErrNoLease", err)
			}
		}))
		serve(mw, request{method: http.MethodGet, key: "k"})
	})
}

func TestInFlightGets409WithRetryAfter(t *testing.T) {
	entered, hold := make(chan struct{}), make(chan struct{})
	ev := &events{}
	mw := newMW(idempotency.Config{Observer: ev, RetryAfter: 3 * time.Second}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(entered)
		<-hold
		w.WriteHeader(http.StatusCreated)
	}))
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- serve(mw, request{key: "k"}) }()
	<-entered
	rec := serve(mw, request{key: "k"})
	wantCode(t, rec, http.StatusConflict)
	if got := rec.Header().Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After = %q, want 3", got)
	}
	// In flight with another payload is still a client error, not a wait.
	wantCode(t, serve(mw, request{key: "k", body: "other"}), http.StatusUnprocessableEntity)
	close(hold)
	wantCode(t, <-done, http.StatusCreated)
	if ev.count(event.ReasonConflict) != 1 || ev.count(event.ReasonMismatch) != 1 {
		t.Errorf("events %v", ev.n)
	}
}

func TestHandlerSeesTheWholeBody(t *testing.T) {
	body := strings.Repeat("0123456789", 10000)
	var got string
	mw := newMW(idempotency.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = string(b)
	}))
	wantCode(t, serve(mw, request{key: "k", body: body}), http.StatusOK)
	if got != body {
		t.Errorf("handler read %d bytes, want %d", len(got), len(body))
	}
}

func TestBodyLimits(t *testing.T) {
	h := &counter{}
	mw := newMW(idempotency.Config{MaxBodyBytes: 10}, h)
	wantCode(t, serve(mw, request{key: "k", body: "0123456789"}), http.StatusCreated)
	wantCode(t, serve(mw, request{key: "k2", body: "0123456789A"}), http.StatusRequestEntityTooLarge)
	// A body whose length is not declared is cut at the limit too.
	req := httptest.NewRequest(http.MethodPost, "/payments", io.MultiReader(strings.NewReader("01234567"), strings.NewReader("89AB")))
	req.ContentLength = -1
	req.Header.Set(idempotency.HeaderKey, "k3")
	rec := httptest.NewRecorder()
	mw.ServeHTTP(rec, req)
	wantCode(t, rec, http.StatusRequestEntityTooLarge)
	if n := h.runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

func TestLargeResponseStoredWithoutBody(t *testing.T) {
	big := strings.Repeat("z", 100)
	var runs atomic.Int32
	mw := newMW(idempotency.Config{MaxResponseBytes: 64}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.Header().Set("Location", "/reports/1")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, big[:50])
		io.WriteString(w, big[50:])
	}))
	first := serve(mw, request{key: "k"})
	if first.Body.String() != big {
		t.Fatalf("first response truncated: %d bytes", first.Body.Len())
	}
	rec := serve(mw, request{key: "k"})
	wantCode(t, rec, http.StatusCreated)
	if rec.Body.Len() != 0 || rec.Header().Get(idempotency.HeaderBodyOmitted) != "true" || rec.Header().Get("Location") != "/reports/1" {
		t.Errorf("replay: body %d bytes, headers %v", rec.Body.Len(), rec.Header())
	}
	if n := runs.Load(); n != 1 {
		t.Errorf("handler ran %d times, want 1: a large response must still complete the key", n)
	}
}

func TestStoredHeaders(t *testing.T) {
	h := &counter{header: http.Header{
		"Set-Cookie": {"session=secret"}, "Date": {"Mon, 01 Jan 2024 00:00:00 GMT"},
		"Location": {"/p/1"}, "X-Trace": {"abc"}, "Connection": {"close"},
	}}
	def := newMW(idempotency.Config{}, h)
	serve(def, request{key: "k"})
	got := serve(def, request{key: "k"}).Header()
	for _, name := range []string{"Set-Cookie", "Date", "Connection"} {
		if got.Get(name) != "" {
			t.Errorf("default replay carries %s", name)
		}
	}
	for _, name := range []string{"Location", "X-Trace"} {
		if got.Get(name) == "" {
			t.Errorf("default replay lacks %s", name)
		}
	}
	only := newMW(idempotency.Config{StoredHeaders: []string{"location", "set-cookie"}}, h)
	serve(only, request{key: "k"})
	got = serve(only, request{key: "k"}).Header()
	if got.Get("Location") != "/p/1" || got.Get("Set-Cookie") != "session=secret" || got.Get("X-Trace") != "" {
		t.Errorf("listed replay headers: %v", got)
	}
}

// fakeStore is a Store of function fields.
type fakeStore struct {
	begin    func(ctx context.Context, key string, fp idempotency.Fingerprint, lease time.Duration) (idempotency.Result, error)
	complete func(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error
	release  func(ctx context.Context, key, token string) error
	extend   func(ctx context.Context, key, token string, lease time.Duration) error
}

func (f *fakeStore) Begin(ctx context.Context, key string, fp idempotency.Fingerprint, lease time.Duration) (idempotency.Result, error) {
	return f.begin(ctx, key, fp, lease)
}
func (f *fakeStore) Complete(ctx context.Context, key, token string, resp *idempotency.Response, ttl time.Duration) error {
	return f.complete(ctx, key, token, resp, ttl)
}
func (f *fakeStore) Release(ctx context.Context, key, token string) error {
	return f.release(ctx, key, token)
}
func (f *fakeStore) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	return f.extend(ctx, key, token, lease)
}

func acquiring() *fakeStore {
	return &fakeStore{
		begin: func(context.Context, string, idempotency.Fingerprint, time.Duration) (idempotency.Result, error) {
			return idempotency.Result{State: idempotency.StateAcquired, Token: "t"}, nil
		},
		complete: func(context.Context, string, string, *idempotency.Response, time.Duration) error { return nil },
		release:  func(context.Context, string, string) error { return nil },
		extend:   func(context.Context, string, string, time.Duration) error { return nil },
	}
}

func TestLeaseAndTTLReachTheStore(t *testing.T) {
	var leases []time.Duration
	var ttl time.Duration
	s := acquiring()
	s.begin = func(_ context.Context, _ string, _ idempotency.Fingerprint, lease time.Duration) (idempotency.Result, error) {
		leases = append(leases, lease)
		return idempotency.Result{State: idempotency.StateAcquired, Token: "t"}, nil
	}
	s.complete = func(_ context.Context, _, _ string, _ *idempotency.Response, d time.Duration) error {
		ttl = d
		return nil
	}
	mw := middleware(s, idempotency.Config{Lease: 10 * time.Second, Logger: quiet()})(&counter{})
	serve(mw, request{key: "k"})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	serve(mw, request{key: "k", ctx: ctx})
	short, cancel2 := context.WithTimeout(context.Background(), time.Second)
	defer cancel2()
	serve(mw, request{key: "k", ctx: short})
	if leases[0] != 10*time.Second {
		t.Errorf("lease without a deadline = %v, want the configured 10s", leases[0])
	}
	if leases[1] <= 2*time.Minute-time.Second || leases[1] > 2*time.Minute+time.Second {
		t.Errorf("lease with a 2m deadline = %v, want the deadline plus 1s", leases[1])
	}
	if leases[2] != 10*time.Second {
		t.Errorf("lease with a 1s deadline = %v, want the configured 10s", leases[2])
	}
	if ttl != 24*time.Hour {
		t.Errorf("TTL = %v, want the default, 24h", ttl)
	}
}

func TestStoreErrorFailsClosed(t *testing.T) {
	var logs bytes.Buffer
	h := &counter{}
	ev := &events{}
	s := acquiring()
	s.begin = func(ctx context.Context, _ string, _ idempotency.Fingerprint, _ time.Duration) (idempotency.Result, error) {
		return idempotency.Result{}, errors.New("dial tcp: connection refused")
	}
	mw := middleware(s, idempotency.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Observer: ev, RetryAfter: 2 * time.Second})(h)
	rec := serve(mw, request{key: "k"})
	wantCode(t, rec, http.StatusServiceUnavailable)
	if got := rec.Header().Get("Retry-After"); got != "2" {
		t.Errorf("Retry-After = %q, want 2", got)
	}
	if h.runs.Load() != 0 {
		t.Error("handler ran without protection")
	}
	if !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "connection refused") {
		t.Errorf("log line: %s", logs.String())
	}
	if ev.count(event.ReasonStoreError) != 1 {
		t.Errorf("events %v", ev.n)
	}
}

func TestInvalidStoreResultIsAStoreError(t *testing.T) {
	s := acquiring()
	s.begin = func(context.Context, string, idempotency.Fingerprint, time.Duration) (idempotency.Result, error) {
		return idempotency.Result{State: idempotency.StateCompleted}, nil // no response
	}
	h := &counter{}
	rec := serve(middleware(s, idempotency.Config{Logger: quiet()})(h), request{key: "k"})
	wantCode(t, rec, http.StatusServiceUnavailable)
	if h.runs.Load() != 0 {
		t.Error("handler ran")
	}
}

func TestLostLeaseIsLoggedAndResponseStillSent(t *testing.T) {
	var logs bytes.Buffer
	s := acquiring()
	s.complete = func(context.Context, string, string, *idempotency.Response, time.Duration) error {
		return idempotency.ErrLockLost
	}
	ev := &events{}
	rec := serve(middleware(s, idempotency.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Observer: ev})(&counter{}), request{key: "k", body: "b"})
	wantCode(t, rec, http.StatusCreated)
	if rec.Body.String() != "run 1 body b" {
		t.Errorf("body %q", rec.Body)
	}
	if !strings.Contains(logs.String(), "lease expired before the handler finished") {
		t.Errorf("log: %s", logs.String())
	}
	if ev.count(event.ReasonStoreError) != 1 {
		t.Errorf("events %v", ev.n)
	}
}

// A handler that fails after its lease was lost has nothing to release:
// the store refuses the release with ErrLockLost, which is not a store
// failure, and the log says the key was no longer held.
func TestReleaseOfALostKeyIsNotAStoreError(t *testing.T) {
	var logs bytes.Buffer
	s := acquiring()
	s.release = func(context.Context, string, string) error { return idempotency.ErrLockLost }
	ev := &events{}
	failing := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadGateway)
	})
	rec := serve(middleware(s, idempotency.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Observer: ev})(failing), request{key: "k", body: "b"})
	wantCode(t, rec, http.StatusBadGateway)
	if !strings.Contains(logs.String(), "no longer held when releasing it") || strings.Contains(logs.String(), "retries get 409") {
		t.Errorf("log: %s", logs.String())
	}
	if n := ev.count(event.ReasonStoreError); n != 0 {
		t.Errorf("%d store_error events, want none", n)
	}
}

func TestClientGoneWithNothingWrittenReleases(t *testing.T) {
	var released atomic.Bool
	s := acquiring()
	s.release = func(ctx context.Context, _, _ string) error {
		if ctx.Err() != nil {
			t.Error("release got the request's canceled context")
		}
		released.Store(true)
		return nil
	}
	s.complete = func(context.Context, string, string, *idempotency.Response, time.Duration) error {
		t.Error("stored a response nobody wrote")
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	mw := middleware(s, idempotency.Config{Logger: quiet()})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cancel() // the client went away; the handler gives up
	}))
	serve(mw, request{key: "k", ctx: ctx})
	if !released.Load() {
		t.Error("key not released")
	}
}

func TestHijackRecordsUnknownOutcome(t *testing.T) {
	for _, release := range []bool{false, true} {
		t.Run(fmt.Sprintf("release=%v", release), func(t *testing.T) {
			done := make(chan string, 1)
			s := acquiring()
			s.release = func(context.Context, string, string) error { done <- "released"; return nil }
			s.complete = func(_ context.Context, _, _ string, resp *idempotency.Response, _ time.Duration) error {
				done <- "completed " + strconv.Itoa(resp.Status)
				return nil
			}
			mw := middleware(s, idempotency.Config{Logger: quiet()})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if release {
					idempotency.Release(r.Context())
				}
				c, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Errorf("hijack through the middleware: %v", err)
					return
				}
				// Settled before the handler got the connection, so a
				// client retrying as soon as it is closed finds the
				// outcome recorded.
				if len(done) != 1 {
					t.Error("the key was not settled when Hijack returned")
				}
				if err := idempotency.Release(r.Context()); !errors.Is(err, idempotency.ErrLeaseLost) {
					t.Errorf("Release after the hijack: %v, want ErrLeaseLost", err)
				}
				c.Close()
			}))
			srv := httptest.NewServer(mw)
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodPost, srv.URL, nil)
			req.Header.Set(idempotency.HeaderKey, "k")
			client := srv.Client()
			defer client.CloseIdleConnections()
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
			}
			want := "completed 500"
			if release {
				want = "released"
			}
			// The server forgets hijacked connections, so wait for the
			// store call itself; the timer only guards against a hang.
			select {
			case got := <-done:
				if got != want {
					t.Errorf("after a hijack the key was %s, want %s", got, want)
				}
			case <-time.After(10 * time.Second):
				t.Error("key neither completed nor released after a hijack")
			}
		})
	}
}

func TestFlushPassesThrough(t *testing.T) {
	mw := newMW(idempotency.Config{}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("flush through the middleware: %v", err)
		}
	}))
	rec := serve(mw, request{key: "k"})
	if !rec.Flushed {
		t.Error("not flushed")
	}
}

func FuzzMiddlewareHeaders(f *testing.F) {
	for _, s := range []string{`"k"`, "k", "a, b", `"a\"b"`, "", "\x00", `"`, strings.Repeat("x", 300)} {
		f.Add(s, s, "body")
	}
	f.Fuzz(func(t *testing.T, key1, key2, body string) {
		h := &counter{}
		mw := newMW(idempotency.Config{}, h)
		req := httptest.NewRequest(http.MethodPost, "/p", strings.NewReader(body))
		req.Header[idempotency.HeaderKey] = []string{key1}
		if key2 != key1 {
			req.Header[idempotency.HeaderKey] = append(req.Header[idempotency.HeaderKey], key2)
		}
		rec := httptest.NewRecorder()
		mw.ServeHTTP(rec, req)
		switch rec.Code {
		case http.StatusCreated:
			if h.runs.Load() != 1 {
				t.Fatal("201 without a run")
			}
		case http.StatusBadRequest:
			if h.runs.Load() != 0 {
				t.Fatal("400 after a run")
			}
		default:
			t.Fatalf("status %d", rec.Code)
		}
	})
}

// readCounter counts the reads of a request body.
type readCounter struct{ n atomic.Int32 }

func (c *readCounter) Read(p []byte) (int, error) { c.n.Add(1); return 0, io.EOF }

// A request Scope refuses is answered before its body is read.
func TestScopeRefusalReadsNoBody(t *testing.T) {
	h := &counter{}
	mw := newMW(idempotency.Config{Scope: byUser}, h)
	body := &readCounter{}
	req := httptest.NewRequest(http.MethodPost, "/payments", body)
	req.Header.Set(idempotency.HeaderKey, "k")
	rec := httptest.NewRecorder()
	mw.ServeHTTP(rec, req)
	wantCode(t, rec, http.StatusForbidden)
	if n := body.n.Load(); n != 0 || h.runs.Load() != 0 {
		t.Errorf("body read %d times, handler ran %d times; want neither", n, h.runs.Load())
	}
}
