package guardhttp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/guardhttp"
)

// Over HTTP/2 many requests share a connection: a phase timeout must
// cancel its stream, not the connection.
func TestHTTP2TimeoutCancelsTheStreamNotTheConnection(t *testing.T) {
	var requests, conns atomic.Int64
	stop := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 {
			t.Errorf("request over %s, want HTTP/2", r.Proto)
		}
		if requests.Add(1) == 1 {
			select { // the first request hangs
			case <-r.Context().Done():
			case <-stop:
			}
			return
		}
		_, _ = io.WriteString(w, "ok")
	}))
	srv.EnableHTTP2 = true
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(stop) })

	base := srv.Client().Transport.(*http.Transport)
	t.Cleanup(base.CloseIdleConnections)
	rt := newTransport(t, base, guardhttp.Config{ResponseHeaderTimeout: 100 * time.Millisecond, Retry: guardrail.Retry{MaxAttempts: 1}})
	c := &http.Client{Transport: rt}

	_, err := get(t, context.Background(), c, srv.URL)
	if te := asTimeout(t, err); te.Phase != event.PhaseResponseHeader {
		t.Fatalf("phase = %s, want %s", te.Phase, event.PhaseResponseHeader)
	}
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if got := readAll(t, resp); got != "ok" {
		t.Errorf("body %q", got)
	}
	if got := conns.Load(); got != 1 {
		t.Errorf("server saw %d connections, want the one HTTP/2 connection kept", got)
	}
}

type ctxKey struct{}

// An Observer's context values (a tracing span) reach the base transport,
// along with the caller's deadline; cancellation is still the caller's.
func TestObserverContextReachesTheBaseTransport(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.AttemptStart {
			return context.WithValue(ctx, ctxKey{}, e.Attempt)
		}
		return ctx
	})
	var gotValue any
	var gotDeadline bool
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		gotValue = r.Context().Value(ctxKey{})
		_, gotDeadline = r.Context().Deadline()
		return http.DefaultTransport.RoundTrip(r)
	})
	rt := newTransport(t, base, guardhttp.Config{Observer: obs})
	t.Cleanup(http.DefaultTransport.(*http.Transport).CloseIdleConnections)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := get(t, ctx, &http.Client{Transport: rt}, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	if gotValue != 1 || !gotDeadline {
		t.Errorf("base saw value %v, deadline %v; want the observer's value 1 and the caller's deadline", gotValue, gotDeadline)
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// With an Observer the attempt's context is built from the engine's, yet
// the caller cancelling still ends the request at once.
func TestCallerCancellationWithAnObserver(t *testing.T) {
	arrived := make(chan struct{})
	var srv *server
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		srv.hang(r)
	})
	rec := &recorder{}
	c := newClient(t, guardhttp.Config{Observer: rec})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { <-arrived; cancel() }()
	_, err := get(t, ctx, c, srv.URL)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	srv.waitClosed(t, 1)
	if got := rec.count(event.AttemptEnd, func(e event.Event) bool { return e.Outcome == event.AttemptIgnored }); got != 1 {
		t.Errorf("%d attempts ignored, want 1: the caller gave up, not the dependency", got)
	}
}

// A base transport that reports no phases gets no phase limits: a slow one
// must not be mistaken for a slow connect (which would make a POST look
// unsent and retry it).
func TestOpaqueBaseTransportGetsNoPhaseLimits(t *testing.T) {
	var calls atomic.Int64
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		select { // a dependency slower than every phase limit below
		case <-time.After(200 * time.Millisecond):
		case <-r.Context().Done():
			return nil, r.Context().Err()
		}
		return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("ok")), Request: r}, nil
	})
	rt := newTransport(t, base, guardhttp.Config{
		ConnectTimeout: 20 * time.Millisecond, WriteTimeout: 20 * time.Millisecond, ResponseHeaderTimeout: 20 * time.Millisecond,
	})
	req, _ := http.NewRequest(http.MethodPost, "http://opaque.test/", strings.NewReader("x"))
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("err = %v, want the slow answer", err)
	}
	if got := readAll(t, resp); got != "ok" || calls.Load() != 1 {
		t.Errorf("body %q after %d calls, want ok after 1", got, calls.Load())
	}
}

func TestResponsesWithoutBody(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	c := newClient(t, guardhttp.Config{BodyIdleTimeout: 10 * time.Millisecond})
	for _, method := range []string{http.MethodHead, http.MethodGet, http.MethodDelete} {
		req, _ := http.NewRequest(method, srv.URL, nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		if got := readAll(t, resp); resp.StatusCode != 204 || got != "" {
			t.Errorf("%s: %d %q", method, resp.StatusCode, got)
		}
	}
	if got := srv.newConns.Load(); got != 1 {
		t.Errorf("%d connections, want 1 reused", got)
	}
}
