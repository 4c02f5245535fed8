package guardhttp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
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
	rt := guardhttp.NewTransport(base, guardhttp.Config{ResponseHeaderTimeout: 100 * time.Millisecond, MaxAttempts: 1})
	c := &http.Client{Transport: rt}

	_, err := get(t, context.Background(), c, srv.URL)
	if te := asTimeout(t, err); te.Phase != guardrail.PhaseResponseHeader {
		t.Fatalf("phase = %s, want %s", te.Phase, guardrail.PhaseResponseHeader)
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
	obs := guardrail.ObserverFunc(func(ctx context.Context, e guardrail.Event) context.Context {
		if e.Kind == guardrail.EventAttemptStart {
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
	rt := guardhttp.NewTransport(base, guardhttp.Config{Observer: obs})
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
	if got := rec.count(guardrail.EventAttemptEnd, func(e guardrail.Event) bool { return e.Outcome == guardrail.OutcomeIgnored }); got != 1 {
		t.Errorf("%d attempts ignored, want 1: the caller gave up, not the dependency", got)
	}
}
