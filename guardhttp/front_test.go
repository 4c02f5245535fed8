package guardhttp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
)

// TestConfigBreakerTunesAndReports: one field tunes every key's breaker,
// and its transitions reach the Observer under the client's name, and the
// breaker's own Observer under the key.
func TestConfigBreakerTunesAndReports(t *testing.T) {
	var calls atomic.Int64
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		http.Error(w, "down", http.StatusServiceUnavailable)
	})
	rec := &recorder{}
	own := &recorder{}
	c := newClient(t, guardhttp.Config{Name: "pricing", Retry: guardrail.Retry{
		MaxAttempts: 1,
	},
		Observer: rec,
		Breaker:  breaker.Config{MinRequests: 2, OpenFor: time.Minute, Observer: own}})
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
	host := strings.TrimPrefix(srv.URL, "http://")
	if n := own.count(event.BreakerTransition, func(e event.Event) bool { return e.Dependency == host && e.To == "open" }); n != 1 {
		t.Errorf("Breaker.Observer got %d transitions to open for %s, want 1: %+v", n, host, own.events)
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
		if _, err := guardhttp.NewTransport(nil, tc.cfg); !errors.Is(err, guardhttp.ErrInvalidConfig) {
			t.Errorf("NewTransport: err = %v, want ErrInvalidConfig", err)
		}
	}
}

// TestNewClientTransport: the Transport under NewClient's client is the
// one it sends through, with the budget it was given and its breakers.
func TestNewClientTransport(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	b := must(budget.New(budget.Config{Ratio: 0.2}))
	c, err := guardhttp.NewClient(guardhttp.Config{Retry: guardrail.Retry{Budget: b}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	tr := c.Transport.(*guardhttp.Transport)
	n := 0
	tr.Breakers().Range(func(string, *breaker.Breaker) bool { n++; return true })
	if tr.RetryBudget() != b || n != 1 {
		t.Errorf("budget ours %v, %d breakers; want ours and 1", tr.RetryBudget() == b, n)
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
		keys = append(keys, r.Header.Get(idempotency.HeaderKey))
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
		seen.Store(r.Header.Get(idempotency.HeaderKey))
		http.Error(w, "busy", http.StatusServiceUnavailable)
	})
	c := newClient(t, guardhttp.Config{IdempotencyKeys: true, Retry: guardrail.Retry{MaxAttempts: 2, Backoff: backoff.None(), Budget: budget.Unlimited()}})
	resp, err := post(t, c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if got := resp.Request.Header.Get(idempotency.HeaderKey); got == "" || got != seen.Load() {
		t.Errorf("resp.Request carries key %q, the server saw %q", got, seen.Load())
	}
}
