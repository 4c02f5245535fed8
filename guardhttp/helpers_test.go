package guardhttp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail/guardhttp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// server is a loopback HTTP server that counts its connections.
type server struct {
	*httptest.Server
	newConns    atomic.Int64
	closedConns atomic.Int64
	closed      chan struct{} // one value per connection closed
	stop        chan struct{} // closed when the test ends: handlers that hang return
}

func newServer(t *testing.T, h http.HandlerFunc) *server {
	t.Helper()
	s := &server{closed: make(chan struct{}, 4096), stop: make(chan struct{})}
	s.Server = httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.newConns.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closedConns.Add(1)
			s.closed <- struct{}{}
		}
	}
	s.Start()
	t.Cleanup(s.Close)
	t.Cleanup(func() { close(s.stop) }) // runs first: unblock hanging handlers
	return s
}

// waitClosed waits until the server has seen n more connections closed.
func (s *server) waitClosed(t *testing.T, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		select {
		case <-s.closed:
		case <-time.After(5 * time.Second):
			t.Fatalf("server saw %d of %d connections closed", i, n)
		}
	}
}

// hang blocks until the client goes away or the test ends.
func (s *server) hang(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-s.stop:
	}
}

// deafListener accepts connections and never reads from them: a server
// whose process is stuck, seen from the network.
type deafListener struct {
	net.Listener
	accepted atomic.Int64
	wg       sync.WaitGroup
}

func newDeafListener(t *testing.T) *deafListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &deafListener{Listener: ln}
	var conns []net.Conn
	var mu sync.Mutex
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			d.accepted.Add(1)
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		d.wg.Wait()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	})
	return d
}

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []event.Event
}

func (r *recorder) Observe(ctx context.Context, e event.Event) context.Context {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
	return ctx
}

func (r *recorder) count(kind event.Kind, match func(event.Event) bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Kind == kind && (match == nil || match(e)) {
			n++
		}
	}
	return n
}

// newTransport returns guardhttp.NewTransport(base, cfg), or fails the test.
func newTransport(t *testing.T, base http.RoundTripper, cfg guardhttp.Config) *guardhttp.Transport {
	t.Helper()
	rt, err := guardhttp.NewTransport(base, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return rt
}

// newClient returns guardhttp.NewClient(cfg), closing its idle connections
// when the test ends.
func newClient(t *testing.T, cfg guardhttp.Config) *http.Client {
	t.Helper()
	c, err := guardhttp.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func get(t *testing.T, ctx context.Context, c *http.Client, url string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return c.Do(req)
}

// readAll reads and closes resp's body.
func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return string(b)
}

// wantTimeout fails the test unless the request got no response and err
// is a *guardhttp.TimeoutError of the given phase and, unless it is zero,
// limit, and returns it.
func wantTimeout(t *testing.T, resp *http.Response, err error, phase string, limit time.Duration) *guardhttp.TimeoutError {
	t.Helper()
	if resp != nil {
		resp.Body.Close()
		t.Fatalf("got a response %d, want a timeout", resp.StatusCode)
	}
	te := asTimeout(t, err)
	if te.Phase != phase || (limit != 0 && te.After != limit) {
		t.Errorf("timeout = %+v, want phase %s after %v", te, phase, limit)
	}
	return te
}

// asTimeout returns err's *TimeoutError or fails the test.
func asTimeout(t *testing.T, err error) *guardhttp.TimeoutError {
	t.Helper()
	var te *guardhttp.TimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *guardhttp.TimeoutError", err)
	}
	return te
}

// within fails the test unless lo <= d <= hi.
func within(t *testing.T, what string, d, lo, hi time.Duration) {
	t.Helper()
	if d < lo || d > hi {
		t.Errorf("%s took %v, want between %v and %v", what, d, lo, hi)
	}
}
