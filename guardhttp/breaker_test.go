package guardhttp_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// breakers trips after 5 calls with half of them failed, and stays open a
// minute: long enough not to reopen during a test.
func breakers() *breaker.Group {
	return must(breaker.NewGroup(breaker.GroupConfig{Config: breaker.Config{MinRequests: 5, OpenFor: time.Minute}}))
}

func TestBreakerPerHost(t *testing.T) {
	var badCalls, goodCalls atomic.Int64
	bad := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		badCalls.Add(1)
		http.Error(w, "down", http.StatusServiceUnavailable)
	})
	good := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		goodCalls.Add(1)
		_, _ = io.WriteString(w, "ok")
	})
	rec := &recorder{}
	c := newClient(t, guardhttp.Config{Retry: guardrail.Retry{MaxAttempts: 1}, Observer: rec})
	// The default breakers trip at 20 calls, half of them failed.
	for i := 0; i < 20; i++ {
		resp, err := get(t, context.Background(), c, bad.URL)
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if readAll(t, resp); resp.StatusCode != 503 {
			t.Fatalf("call %d: status %d", i+1, resp.StatusCode)
		}
	}
	// 20 failures of 20: the bad host's breaker is open.
	start := time.Now()
	_, err := get(t, context.Background(), c, bad.URL)
	if !errors.Is(err, guardrail.ErrCircuitOpen) {
		t.Fatalf("err = %v, want guardrail.ErrCircuitOpen", err)
	}
	var ge *guardrail.Error
	if !errors.As(err, &ge) || ge.RetryIn < 29*time.Second || ge.RetryIn > 37*time.Second {
		t.Errorf("err = %v: want it to say when to try again (30 s + up to 20 %%)", err)
	}
	within(t, "a refused call", time.Since(start), 0, 100*time.Millisecond)
	if got := badCalls.Load(); got != 20 {
		t.Errorf("bad host saw %d calls, want 20: the open breaker sends none", got)
	}
	// The other host has a breaker of its own.
	resp, err := get(t, context.Background(), c, good.URL)
	if err != nil {
		t.Fatalf("good host: %v", err)
	}
	readAll(t, resp)
	if goodCalls.Load() != 1 {
		t.Errorf("good host saw %d calls, want 1", goodCalls.Load())
	}
	host := strings.TrimPrefix(bad.URL, "http://")
	if got := rec.count(event.BreakerTransition, func(e event.Event) bool {
		return e.Dependency == host && e.From == "closed" && e.To == "open"
	}); got != 1 {
		t.Errorf("%d closed -> open transitions reported for %s, want 1", got, host)
	}
	if got := rec.count(event.BreakerReject, nil); got != 1 {
		t.Errorf("%d breaker_reject events, want 1", got)
	}
}

func TestClientErrorsDoNotTripTheBreaker(t *testing.T) {
	var calls atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.NotFound(w, r)
	})
	group := breakers()
	c := newClient(t, guardhttp.Config{Breakers: group})
	for i := 0; i < 30; i++ {
		resp, err := get(t, context.Background(), c, srv.URL)
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		readAll(t, resp)
	}
	b := group.Get(strings.TrimPrefix(srv.URL, "http://"))
	if m := b.Metrics(); m.State != breaker.Closed || m.Failures != 0 {
		t.Errorf("after 30 x 404: state %v with %d failures, want closed with 0", m.State, m.Failures)
	}
	if got := calls.Load(); got != 30 {
		t.Errorf("server saw %d calls, want 30", got)
	}
}

func TestBreakerKeyedByRoute(t *testing.T) {
	var calls atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path == "/reports" {
			http.Error(w, "slow path broken", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	group := breakers()
	c := newClient(t, guardhttp.Config{
		Retry: guardrail.Retry{
			MaxAttempts: 1,
		},
		Breakers: group,
		Key:      func(r *http.Request) string { return r.URL.Host + r.URL.Path },
	})
	for i := 0; i < 5; i++ {
		resp, err := get(t, context.Background(), c, srv.URL+"/reports")
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
	if _, err := get(t, context.Background(), c, srv.URL+"/reports"); !errors.Is(err, guardrail.ErrCircuitOpen) {
		t.Errorf("/reports: err = %v, want its breaker open", err)
	}
	resp, err := get(t, context.Background(), c, srv.URL+"/orders")
	if err != nil {
		t.Fatalf("/orders: %v: one route's breaker must not stop another's", err)
	}
	readAll(t, resp)
	if got := calls.Load(); got != 6 {
		t.Errorf("server saw %d calls, want 6", got)
	}
}

// A breaker that opens between two attempts stops the retries: the caller
// gets the last response at once.
func TestBreakerOpeningStopsRetries(t *testing.T) {
	var calls atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "down", http.StatusServiceUnavailable)
	})
	group := must(breaker.NewGroup(breaker.GroupConfig{Config: breaker.Config{MinRequests: 2, OpenFor: time.Minute}}))
	c := newClient(t, unlimited(guardhttp.Config{Retry: guardrail.Retry{MaxAttempts: 5}, Breakers: group}))
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatalf("err = %v, want the last 503", err)
	}
	if readAll(t, resp); resp.StatusCode != 503 {
		t.Errorf("status %d, want 503", resp.StatusCode)
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("server saw %d calls, want 2: the breaker opened after the second", got)
	}
}

func TestBulkheadHoldsTheSlotUntilTheBodyIsClosed(t *testing.T) {
	var calls atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		_, _ = io.WriteString(w, "ok")
	})
	other := newServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	rec := &recorder{}
	c := newClient(t, guardhttp.Config{Bulkhead: &bulkhead.Config{MaxConcurrent: 1}, Observer: rec})

	first, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	// first's body is unread: its attempt, and its slot, are not over.
	_, err = get(t, context.Background(), c, srv.URL)
	if !errors.Is(err, guardrail.ErrBulkheadFull) {
		t.Fatalf("second call: err = %v, want guardrail.ErrBulkheadFull", err)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("server saw %d calls, want 1", got)
	}
	if got := rec.count(event.BulkheadReject, func(e event.Event) bool { return e.InFlight == 1 && e.Limit == 1 }); got != 1 {
		t.Errorf("%d bulkhead_reject events, want 1", got)
	}
	// Another host has its own compartment.
	resp, err := get(t, context.Background(), c, other.URL)
	if err != nil {
		t.Fatalf("other host: %v", err)
	}
	readAll(t, resp)

	readAll(t, first) // frees the slot
	resp, err = get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatalf("after the first body was closed: %v", err)
	}
	readAll(t, resp)
	if got := calls.Load(); got != 2 {
		t.Errorf("server saw %d calls, want 2", got)
	}
}

func TestBulkheadWaitsNoLongerThanTheTimeLeft(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	c := newClient(t, guardhttp.Config{
		Retry: guardrail.Retry{
			Backoff: backoff.None(),
		},
		Bulkhead: &bulkhead.Config{MaxConcurrent: 1, MaxQueue: 10, MaxWait: time.Minute},
	})
	first, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer readAll(t, first)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = get(t, ctx, c, srv.URL)
	if !errors.Is(err, guardrail.ErrBulkheadFull) {
		t.Fatalf("err = %v, want guardrail.ErrBulkheadFull", err)
	}
	// It waits until the deadline minus MinAttempt (50 ms), not a minute.
	within(t, "the wait", time.Since(start), 150*time.Millisecond-10*time.Millisecond, 150*time.Millisecond+slack)
}

// must returns v, for constructors given a configuration the test knows is
// valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
