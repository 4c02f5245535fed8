package idempotency_test

import (
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

// TestOneCallerCannotFillTheStore: one caller sending new keys stops at
// the default quota of 10,000 live keys with 429 and a Retry-After of when
// its first key expires, and another caller's new key still runs. Before
// the quota, the first caller filled the store and the second got 503.
func TestOneCallerCannotFillTheStore(t *testing.T) {
	if testing.Short() {
		t.Skip("10,050 requests")
	}
	const entries = 10_050
	store := must(memstore.New(memstore.Config{MaxEntries: entries}))
	h := &counter{}
	mw := middleware(store, idempotency.Config{Scope: byUser, Logger: quiet()})(h)
	var created, refused int
	var last *http.Response
	for i := range entries {
		rec := serve(mw, request{key: "k" + strconv.Itoa(i), principal: "mallory"})
		switch rec.Code {
		case http.StatusCreated:
			created++
		case http.StatusTooManyRequests:
			refused++
			last = rec.Result()
		default:
			t.Fatalf("request %d: status %d; body %s", i, rec.Code, rec.Body)
		}
	}
	if created != 10_000 || refused != entries-10_000 {
		t.Errorf("mallory: %d created, %d refused; want 10000 and %d", created, refused, entries-10_000)
	}
	if refused > 0 {
		ra, err := strconv.Atoi(last.Header.Get("Retry-After"))
		if ttl := int((24 * time.Hour).Seconds()); err != nil || ra < ttl-60 || ra > ttl {
			t.Errorf("Retry-After = %q, want about %d (when mallory's first key expires)", last.Header.Get("Retry-After"), ttl)
		}
	}
	rec := serve(mw, request{key: "k0", principal: "alice"})
	wantCode(t, rec, http.StatusCreated)
	if n := h.runs.Load(); n != 10_001 {
		t.Errorf("handler ran %d times, want 10001", n)
	}
}

// TestScopeQuota: a caller at MaxKeysPerScope gets 429 for a new key,
// whatever FailOpen says, without the handler running; its live keys are
// still replayed; a released key (a 5xx) does not count; a negative quota
// is no limit, and one tenant has none.
func TestScopeQuota(t *testing.T) {
	ev := &events{}
	h := &counter{}
	failing := &counter{status: http.StatusServiceUnavailable}
	mux := http.NewServeMux()
	mux.Handle("/payments", h)
	mux.Handle("/failing", failing)
	mw := newMW(idempotency.Config{Scope: byUser, MaxKeysPerScope: 2, FailOpen: true, Observer: ev}, mux)

	for range 3 { // released every time: they never count
		wantCode(t, serve(mw, request{target: "/failing", key: "f", principal: "a"}), http.StatusServiceUnavailable)
	}
	wantCode(t, serve(mw, request{key: "k1", principal: "a"}), http.StatusCreated)
	wantCode(t, serve(mw, request{key: "k2", principal: "a"}), http.StatusCreated)
	rec := serve(mw, request{key: "k3", principal: "a"})
	wantCode(t, rec, http.StatusTooManyRequests)
	if rec.Header().Get("Retry-After") == "" || rec.Header().Get("Content-Type") != "application/problem+json" {
		t.Errorf("429 header: %v", rec.Header())
	}
	if got := ev.count("rate_limit"); got != 1 {
		t.Errorf("%d rate_limit events, want 1", got)
	}
	replayed := serve(mw, request{key: "k1", principal: "a"})
	wantCode(t, replayed, http.StatusCreated)
	if replayed.Header().Get(idempotency.HeaderReplayed) != "true" {
		t.Error("a live key of a full scope was not replayed")
	}
	wantCode(t, serve(mw, request{key: "k3", principal: "b"}), http.StatusCreated)
	if n := h.runs.Load(); n != 3 {
		t.Errorf("handler ran %d times, want 3", n)
	}

	unlimited := newMW(idempotency.Config{Scope: byUser, MaxKeysPerScope: -1}, &counter{})
	single := newMW(idempotency.Config{MaxKeysPerScope: 1}, &counter{})
	for i := range 5 {
		wantCode(t, serve(unlimited, request{key: "k" + strconv.Itoa(i), principal: "a"}), http.StatusCreated)
		wantCode(t, serve(single, request{key: "k" + strconv.Itoa(i)}), http.StatusCreated)
	}
}
