package guardhttp_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// route is one way a request reaches a server: HTTP/1 in clear, HTTP/2
// over TLS, and each through a proxy (a forward proxy for the clear
// request, a CONNECT tunnel for the TLS one). Every phase timeout must
// behave the same on all of them.
type route struct {
	name  string
	https bool // the server speaks TLS (HTTP/2 when the client offers it)
	proxy bool
}

var routes = []route{
	{name: "HTTP/1"},
	{name: "HTTP/2", https: true},
	{name: "HTTP/1 via proxy", proxy: true},
	{name: "HTTP/2 via CONNECT", https: true, proxy: true},
}

// target is a server on a route, with the transport that reaches it.
type target struct {
	url  string
	base *http.Transport
	stop chan struct{} // closed when the test ends: handlers that hang return
}

// start serves h on r and returns a transport that reaches it. The
// transport has no timeouts of its own.
func (r route) start(t *testing.T, h http.HandlerFunc) *target {
	t.Helper()
	tg := &target{stop: make(chan struct{})}
	var proxy *url.URL
	if r.proxy {
		// First, so that it is closed last: the server's handlers return
		// first, and then the proxy's forwarded requests end.
		proxy = startProxy(t)
	}
	srv := httptest.NewUnstartedServer(h)
	if r.https {
		srv.EnableHTTP2 = true
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(tg.stop) }) // runs first: unblock hanging handlers
	tg.url = srv.URL
	tg.base = newBase()
	if r.https {
		tg.base.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
	}
	if r.proxy {
		tg.base.Proxy = http.ProxyURL(proxy)
	}
	t.Cleanup(tg.base.CloseIdleConnections)
	return tg
}

// proto is the protocol the server must see.
func (r route) proto() int {
	if r.https {
		return 2
	}
	return 1
}

// newBase is a transport with nothing set but HTTP/2.
func newBase() *http.Transport { return &http.Transport{ForceAttemptHTTP2: true} }

// hang blocks until the request goes away or the test ends.
func (tg *target) hang(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-tg.stop:
	}
}

// startProxy starts an HTTP proxy on loopback: CONNECT opens a tunnel,
// any other method is forwarded, its response streamed back as it comes.
func startProxy(t *testing.T) *url.URL {
	t.Helper()
	out := &http.Transport{}
	var (
		tunnels sync.WaitGroup
		mu      sync.Mutex
		closing bool // no tunnel opens once the test ends
	)
	p := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodConnect {
			up, err := net.Dial("tcp", r.Host)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
			w.WriteHeader(http.StatusOK)
			down, buf, err := http.NewResponseController(w).Hijack()
			if err != nil {
				up.Close()
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if closing {
				up.Close()
				down.Close()
				return
			}
			tunnels.Add(2)
			go func() { defer tunnels.Done(); _, _ = io.Copy(up, buf); up.Close() }()
			go func() { defer tunnels.Done(); _, _ = io.Copy(down, up); down.Close() }()
			return
		}
		req := r.Clone(r.Context())
		req.RequestURI = ""
		resp, err := out.RoundTrip(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		rc := http.NewResponseController(w)
		buf := make([]byte, 32<<10)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				_, _ = w.Write(buf[:n])
				_ = rc.Flush()
			}
			if err != nil {
				return
			}
		}
	}))
	t.Cleanup(func() {
		p.CloseClientConnections()
		p.Close()
		out.CloseIdleConnections()
		mu.Lock()
		closing = true
		mu.Unlock()
		tunnels.Wait()
	})
	u, _ := url.Parse(p.URL)
	return u
}

// endless is an endless request body.
type endless struct{}

func (endless) Read(p []byte) (int, error) { clear(p); return len(p), nil }

// Each phase of an attempt times out on every route with the same error:
// a *TimeoutError naming the phase, with the configured limit, promptly.
func TestEveryPhaseTimesOutTheSameOnEveryRoute(t *testing.T) {
	const limit = 150 * time.Millisecond
	long := 20 * limit // the limits of the phases not under test
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			t.Run("response_header", func(t *testing.T) {
				var tg *target
				tg = r.start(t, func(w http.ResponseWriter, req *http.Request) {
					if req.ProtoMajor != r.proto() {
						t.Errorf("server saw %s", req.Proto)
					}
					tg.hang(req)
				})
				rt := newTransport(t, tg.base, guardhttp.Config{ResponseHeaderTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
				start := time.Now()
				resp, err := get(t, context.Background(), &http.Client{Transport: rt}, tg.url)
				wantTimeout(t, resp, err, event.PhaseResponseHeader, limit)
				within(t, "response header", time.Since(start), limit, limit+slack)
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("err = %v, want one that Is context.DeadlineExceeded", err)
				}
			})
			t.Run("body_idle", func(t *testing.T) {
				var tg *target
				tg = r.start(t, func(w http.ResponseWriter, req *http.Request) {
					_, _ = io.WriteString(w, "start")
					_ = http.NewResponseController(w).Flush()
					tg.hang(req)
				})
				rt := newTransport(t, tg.base, guardhttp.Config{BodyIdleTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
				resp, err := get(t, context.Background(), &http.Client{Transport: rt}, tg.url)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				start := time.Now()
				b, err := io.ReadAll(resp.Body)
				if te := asTimeout(t, err); te.Phase != event.PhaseBodyIdle || te.After != limit {
					t.Errorf("timeout = %+v, want body_idle after %v", te, limit)
				}
				within(t, "body idle", time.Since(start), limit, limit+slack)
				if string(b) != "start" {
					t.Errorf("read %q before the stall, want %q", b, "start")
				}
			})
			t.Run("write", func(t *testing.T) {
				var tg *target
				tg = r.start(t, func(w http.ResponseWriter, req *http.Request) {
					tg.hang(req) // never reads the endless body
				})
				rt := newTransport(t, tg.base, guardhttp.Config{WriteTimeout: limit, ResponseHeaderTimeout: long, Retry: guardrail.Retry{MaxAttempts: 1}})
				req, err := http.NewRequest(http.MethodPut, tg.url, endless{})
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				resp, err := (&http.Client{Transport: rt}).Do(req)
				wantTimeout(t, resp, err, event.PhaseWrite, limit)
				within(t, "write", time.Since(start), limit, limit+slack)
			})
			t.Run("connect", func(t *testing.T) {
				tg := r.start(t, func(http.ResponseWriter, *http.Request) {})
				// The dial (to the server, or to the proxy) never completes
				// until the test ends.
				stop := make(chan struct{})
				t.Cleanup(func() { close(stop) })
				tg.base.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
					select {
					case <-ctx.Done():
						return nil, ctx.Err()
					case <-stop:
						return nil, errors.New("test over")
					}
				}
				rt := newTransport(t, tg.base, guardhttp.Config{ConnectTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
				start := time.Now()
				resp, err := get(t, context.Background(), &http.Client{Transport: rt}, tg.url)
				wantTimeout(t, resp, err, event.PhaseConnect, limit)
				within(t, "connect", time.Since(start), limit, limit+slack)
			})
			if r.https {
				t.Run("tls", func(t *testing.T) {
					tg := r.start(t, func(http.ResponseWriter, *http.Request) {})
					deaf := newDeafListener(t) // accepts, never answers the handshake
					u, _ := url.Parse(tg.url)
					u.Host = deaf.Addr().String()
					rt := newTransport(t, tg.base, guardhttp.Config{TLSHandshakeTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
					start := time.Now()
					resp, err := get(t, context.Background(), &http.Client{Transport: rt}, u.String())
					wantTimeout(t, resp, err, event.PhaseTLS, limit)
					within(t, "tls", time.Since(start), limit, limit+slack)
				})
			}
		})
	}
}

// A response-header timeout ends one request: the next on the same client
// goes through, on every route.
func TestEveryRouteRecoversAfterATimeout(t *testing.T) {
	const limit = 100 * time.Millisecond
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			var tg *target
			tg = r.start(t, func(w http.ResponseWriter, req *http.Request) {
				if req.URL.Path == "/hang" {
					tg.hang(req)
					return
				}
				_, _ = io.WriteString(w, "ok")
			})
			rt := newTransport(t, tg.base, guardhttp.Config{ResponseHeaderTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
			c := &http.Client{Transport: rt}
			resp, err := get(t, context.Background(), c, tg.url+"/hang")
			wantTimeout(t, resp, err, event.PhaseResponseHeader, limit)
			resp, err = get(t, context.Background(), c, tg.url+"/ok")
			if err != nil {
				t.Fatal(err)
			}
			if got := readAll(t, resp); got != "ok" {
				t.Errorf("body %q", got)
			}
		})
	}
}
