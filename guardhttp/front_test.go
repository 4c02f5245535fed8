package guardhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
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
	"github.com/guardrail-go/guardrail/shed"
)

// TestConfigBreakerTunesAndReports: one field tunes every key's breaker,
// and its transitions reach the Observer under the client's name, after
// the breaker's own OnTransition.
func TestConfigBreakerTunesAndReports(t *testing.T) {
	var calls atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "down", http.StatusServiceUnavailable)
	})
	rec := &recorder{}
	var own atomic.Int64
	c := newClient(t, guardhttp.Config{Name: "pricing", Retry: guardrail.Retry{
		MaxAttempts: 1,
	},
		Observer: rec,
		Breaker:  breaker.Config{MinRequests: 2, OpenFor: time.Minute, OnTransition: func(breaker.Transition) { own.Add(1) }}})
	for i := range 2 {
		resp, err := get(t, context.Background(), c, srv.URL)
		if err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		readAll(t, resp)
	}
	if _, err := get(t, context.Background(), c, srv.URL); !errors.Is(err, guardrail.ErrCircuitOpen) {
		t.Fatalf("third call: err = %v, want the breaker open after MinRequests 2", err)
	}
	if got := calls.Load(); got != 2 {
		t.Errorf("server saw %d calls, want 2", got)
	}
	opened := rec.count(event.BreakerTransition, func(e event.Event) bool { return e.Dependency == "pricing" && e.To == "open" })
	if opened != 1 {
		t.Errorf("%d transitions to open for dependency pricing, want 1: %+v", opened, rec.events)
	}
	if own.Load() != 1 {
		t.Errorf("Breaker.OnTransition called %d times, want 1", own.Load())
	}
}

func TestConfigBreakerInvalid(t *testing.T) {
	g := must(breaker.NewGroup(breaker.GroupConfig{}))
	for _, tc := range []struct {
		cfg  guardhttp.Config
		want string
	}{
		{guardhttp.Config{Breaker: breaker.Config{MinRequests: 5}, Breakers: g}, "Config.Breaker and Config.Breakers are both set"},
		{guardhttp.Config{Breaker: breaker.Config{FailureRate: 1.5}}, "Config.Breaker: breaker: Config.FailureRate is 1.5"},
	} {
		_, err := guardhttp.NewClient(tc.cfg)
		if !errors.Is(err, guardhttp.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want ErrInvalidConfig saying %q", err, tc.want)
		}
		if _, err := guardhttp.New(tc.cfg); !errors.Is(err, guardhttp.ErrInvalidConfig) {
			t.Errorf("New: err = %v, want ErrInvalidConfig", err)
		}
	}
}

// TestNewGivesTypedAccess: New's Client exposes the Transport it sends
// through, its budget and its breakers.
func TestNewGivesTypedAccess(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	b := must(budget.New(budget.Config{Ratio: 0.2}))
	c, err := guardhttp.New(guardhttp.Config{Retry: guardrail.Retry{Budget: b}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	resp, err := get(t, context.Background(), c.Client, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if c.Transport() != c.Client.Transport || c.RetryBudget() != b || c.Breakers().Len() != 1 {
		t.Errorf("Transport %p (client's %p), budget ours %v, %d breakers", c.Transport(), c.Client.Transport, c.RetryBudget() == b, c.Breakers().Len())
	}
}

// committing is a server that commits every POST and then loses the
// answer (it closes the connection without writing one), recording the
// Idempotency-Key of each attempt.
func committing(t *testing.T) (*server, func() []string) {
	var mu sync.Mutex
	var keys []string
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		keys = append(keys, r.Header.Get(guardhttp.HeaderIdempotencyKey))
		mu.Unlock()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	return srv, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), keys...)
	}
}

func post(t *testing.T, c *http.Client, url string) (*http.Response, error) {
	t.Helper()
	return c.Post(url, "application/json", strings.NewReader(`{"order":82}`))
}

// TestGeneratedKeyOnError: the order is committed on every attempt and no
// answer comes back. The caller learns that the outcome is unknown and
// which key the attempts carried, so it can send the same intent again.
func TestGeneratedKeyOnError(t *testing.T) {
	srv, keys := committing(t)
	c := newClient(t, guardhttp.Config{IdempotencyKeys: true, Retry: guardrail.Retry{MaxAttempts: 3, Backoff: backoff.None(), Budget: budget.Unlimited()}})
	_, err := post(t, c, srv.URL)
	if !errors.Is(err, guardrail.ErrOutcomeUnknown) {
		t.Errorf("err = %v, want ErrOutcomeUnknown: the order may have been committed", err)
	}
	var ke *guardhttp.IdempotencyKeyError
	if !errors.As(err, &ke) {
		t.Fatalf("err = %v, want it to carry the generated key", err)
	}
	seen := keys()
	if len(seen) != 3 {
		t.Fatalf("server saw %d attempts, want 3", len(seen))
	}
	for i, k := range seen {
		if k != ke.Key || k == "" {
			t.Errorf("attempt %d carried key %q, the error says %q", i+1, k, ke.Key)
		}
	}
	if !strings.Contains(err.Error(), ke.Key) {
		t.Errorf("err %q does not name the key", err)
	}
}

// TestPostResetAfterSendIsOutcomeUnknown: a POST without a key whose
// answer is lost is not retried, and says its outcome is unknown rather
// than handing over the bare reset.
func TestPostResetAfterSendIsOutcomeUnknown(t *testing.T) {
	srv, keys := committing(t)
	c := newClient(t, guardhttp.Config{Retry: guardrail.Retry{MaxAttempts: 3, Backoff: backoff.None()}})
	_, err := post(t, c, srv.URL)
	if !errors.Is(err, guardrail.ErrOutcomeUnknown) {
		t.Errorf("err = %v, want ErrOutcomeUnknown", err)
	}
	var ke *guardhttp.IdempotencyKeyError
	if errors.As(err, &ke) {
		t.Errorf("err = %v carries a key, but none was generated", err)
	}
	if got := len(keys()); got != 1 {
		t.Errorf("server saw %d attempts, want 1 (a POST is not retried)", got)
	}
	// The same for a GET is an ordinary failure: it is idempotent.
	_, err = get(t, context.Background(), newClient(t, guardhttp.Config{Retry: guardrail.Retry{MaxAttempts: 1}}), srv.URL)
	if err == nil || errors.Is(err, guardrail.ErrOutcomeUnknown) {
		t.Errorf("GET: err = %v, want the cause alone", err)
	}
}

// TestPostNeverSentIsNotOutcomeUnknown: nothing listens, so the request
// never left: the outcome is known (nothing happened), the key is still
// given.
func TestPostNeverSentIsNotOutcomeUnknown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "http://" + ln.Addr().String()
	ln.Close()
	c := newClient(t, guardhttp.Config{IdempotencyKeys: true, Retry: guardrail.Retry{MaxAttempts: 2, Backoff: backoff.None(), Budget: budget.Unlimited()}})
	_, err = post(t, c, addr)
	if err == nil || errors.Is(err, guardrail.ErrOutcomeUnknown) {
		t.Errorf("err = %v, want a refused connection, not an unknown outcome", err)
	}
	var ke *guardhttp.IdempotencyKeyError
	if !errors.As(err, &ke) || len(ke.Key) != 32 {
		t.Errorf("err = %v, want it to carry the key", err)
	}
}

// TestGeneratedKeyOnResponse: when the last attempt got a response, the
// key is on the request the response answers.
func TestGeneratedKeyOnResponse(t *testing.T) {
	var seen atomic.Value
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get(guardhttp.HeaderIdempotencyKey))
		http.Error(w, "busy", http.StatusServiceUnavailable)
	})
	c := newClient(t, guardhttp.Config{IdempotencyKeys: true, Retry: guardrail.Retry{MaxAttempts: 2, Backoff: backoff.None(), Budget: budget.Unlimited()}})
	resp, err := post(t, c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := resp.Request.Header.Get(guardhttp.HeaderIdempotencyKey); got == "" || got != seen.Load() {
		t.Errorf("resp.Request carries key %q, the server saw %q", got, seen.Load())
	}
}

// TestErrorStatus maps every sentinel, and the errors that carry them, to
// a status and a Retry-After.
func TestErrorStatus(t *testing.T) {
	open := &breaker.OpenError{Until: time.Now().Add(90 * time.Second)}
	urlErr := func(err error) error { return &url.Error{Op: "Get", URL: "http://pricing/", Err: err} }
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	for _, tc := range []struct {
		name   string
		err    error
		status int
		ra     time.Duration // -1: about 90 s
	}{
		{"nil", nil, 200, 0},
		{"outcome unknown", guardrail.ErrOutcomeUnknown, 502, 0},
		{"outcome unknown with key, through http.Client", urlErr(&guardhttp.IdempotencyKeyError{Key: "k", Err: &guardrail.Error{Kind: guardrail.ErrOutcomeUnknown, Attempts: 3, Err: guardrail.ErrBudgetExhausted}}), 502, 0},
		{"outcome unknown after a phase timeout", &guardrail.Error{Kind: guardrail.ErrOutcomeUnknown, Err: &guardhttp.TimeoutError{Phase: event.PhaseResponseHeader}}, 502, 0},
		{"canceled", context.Canceled, guardhttp.StatusClientClosedRequest, 0},
		{"canceled, through http.Client", urlErr(context.Canceled), guardhttp.StatusClientClosedRequest, 0},
		{"circuit open", guardrail.ErrCircuitOpen, 503, 0},
		{"circuit open with RetryIn", urlErr(&guardrail.Error{Kind: guardrail.ErrCircuitOpen, RetryIn: 12 * time.Second}), 503, 12 * time.Second},
		{"breaker open", breaker.ErrOpen, 503, 0},
		{"breaker OpenError", fmt.Errorf("pricing: %w", open), 503, -1},
		{"bulkhead full", &guardrail.Error{Kind: guardrail.ErrBulkheadFull, Err: bulkhead.ErrFull}, 503, 0},
		{"bulkhead.ErrFull", bulkhead.ErrFull, 503, 0},
		{"shed", shed.ErrShed, 503, guardhttp.DefaultShedRetryAfter},
		{"shed.Error", &shed.Error{Reason: event.ReasonCapacity}, 503, guardhttp.DefaultShedRetryAfter},
		{"budget exhausted", guardrail.ErrBudgetExhausted, 503, 0},
		{"budget exhausted after a Retry-After", &guardrail.Error{Kind: guardrail.ErrBudgetExhausted, RetryIn: 3 * time.Second}, 503, 3 * time.Second},
		{"budget exhausted after a timeout", &guardrail.Error{Kind: guardrail.ErrBudgetExhausted, Err: &guardhttp.TimeoutError{Phase: event.PhaseConnect}}, 503, 0},
		{"deadline", guardrail.ErrDeadline, 504, 0},
		{"deadline exceeded", urlErr(context.DeadlineExceeded), 504, 0},
		{"guardhttp.ErrTimeout", guardhttp.ErrTimeout, 504, 0},
		{"phase timeout", urlErr(&guardhttp.TimeoutError{Phase: event.PhaseConnect}), 504, 0},
		{"connection refused", urlErr(refused), 502, 0},
		{"bare *url.Error", urlErr(errors.New("malformed HTTP response")), 502, 0},
		{"other", errors.New("template: no such field"), 500, 0},
	} {
		status, ra := guardhttp.ErrorStatus(tc.err)
		okRA := ra == tc.ra || (tc.ra == -1 && ra > 85*time.Second && ra <= 90*time.Second)
		if status != tc.status || !okRA {
			t.Errorf("%s: ErrorStatus = %d, %v; want %d, %v", tc.name, status, ra, tc.status, tc.ra)
		}
	}
}

func TestWriteError(t *testing.T) {
	for _, tc := range []struct {
		err        error
		status     int
		retryAfter string
		body       string
	}{
		{&guardrail.Error{Kind: guardrail.ErrCircuitOpen, RetryIn: 1200 * time.Millisecond}, 503, "2", "circuit open"},
		{shed.ErrShed, 503, "1", "request shed"},
		{&guardrail.Error{Kind: guardrail.ErrOutcomeUnknown, Err: errors.New("read tcp 10.0.0.7:443: reset")}, 502, "", "outcome unknown"},
		{guardrail.ErrDeadline, 504, "", "Gateway Timeout"},
		{context.Canceled, 499, "", "client closed request"},
	} {
		w := httptest.NewRecorder()
		guardhttp.WriteError(w, tc.err)
		if w.Code != tc.status || w.Header().Get("Retry-After") != tc.retryAfter || !strings.Contains(w.Body.String(), tc.body) {
			t.Errorf("%v: %d Retry-After %q %q; want %d %q containing %q", tc.err, w.Code, w.Header().Get("Retry-After"), w.Body.String(), tc.status, tc.retryAfter, tc.body)
		}
		if strings.Contains(w.Body.String(), "10.0.0.7") {
			t.Errorf("%v: the body gives away the error's details: %q", tc.err, w.Body.String())
		}
	}
}

// TestWriteErrorOpenBreaker: a handler whose dependency's breaker is open
// answers 503 with Retry-After the time to the next probe.
func TestWriteErrorOpenBreaker(t *testing.T) {
	down := newServer(t, func(w http.ResponseWriter, r *http.Request) { http.Error(w, "down", http.StatusServiceUnavailable) })
	c := newClient(t, guardhttp.Config{Retry: guardrail.Retry{MaxAttempts: 1}, Breaker: breaker.Config{MinRequests: 1, OpenFor: 40 * time.Second, OpenJitter: -1}})
	resp, err := get(t, context.Background(), c, down.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	_, err = get(t, context.Background(), c, down.URL)
	w := httptest.NewRecorder()
	guardhttp.WriteError(w, err)
	if w.Code != 503 || (w.Header().Get("Retry-After") != "40" && w.Header().Get("Retry-After") != "39") {
		t.Errorf("%v: %d Retry-After %q, want 503 and 40", err, w.Code, w.Header().Get("Retry-After"))
	}
}
