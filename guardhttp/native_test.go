package guardhttp

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

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/deadline"
)

// The traced path recognises the response-header timeouts *http.Transport
// raises by their message, the native path the dialer's by its shape.
// These tests raise each for real, so that a Go release that changes one
// fails here rather than in production.
func TestBaseTransportTimeoutMessages(t *testing.T) {
	stop := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(hang.Close)
	hang2 := httptest.NewUnstartedServer(hang.Config.Handler)
	hang2.EnableHTTP2 = true
	hang2.StartTLS()
	t.Cleanup(hang2.Close)
	t.Cleanup(func() { close(stop) })
	h2 := hang2.Client().Transport.(*http.Transport).Clone()
	h2.ResponseHeaderTimeout = 20 * time.Millisecond

	tests := []struct {
		name string
		tr   *http.Transport
		url  string
		want phase
		msg  string // in the error
	}{
		{
			name: "response header",
			tr:   &http.Transport{ResponseHeaderTimeout: 20 * time.Millisecond},
			url:  hang.URL,
			want: phaseHeader,
			msg:  msgHeaderTimeout,
		},
		{
			name: "response header, HTTP/2",
			tr:   h2,
			url:  hang2.URL,
			want: phaseHeader,
			msg:  msgHTTP2HeaderTimeout,
		},
		{
			name: "dial, in DNS",
			tr:   &http.Transport{DialContext: (&net.Dialer{Timeout: 20 * time.Millisecond, Resolver: hangingResolver()}).DialContext},
			url:  "http://never.resolves.test/",
			want: phaseConnect,
			msg:  "dial tcp",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer tt.tr.CloseIdleConnections()
			req, _ := http.NewRequest(http.MethodGet, tt.url, nil)
			resp, err := tt.tr.RoundTrip(req)
			if resp != nil {
				resp.Body.Close()
			}
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				t.Fatalf("err = %v, want a timeout", err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("err = %q, want it to say %q", err, tt.msg)
			}
			// A native attempt meets only the dialer's: its base has no
			// response-header timeout.
			wantNative := phaseStart
			if tt.want == phaseConnect {
				wantNative = phaseConnect
			}
			if got := nativePhase(err); got != wantNative {
				t.Errorf("nativePhase(%q) = %v, want %v", err, phaseNames[got], phaseNames[wantNative])
			}
			if got, want := isHeaderTimeout(err), tt.want == phaseHeader; got != want {
				t.Errorf("isHeaderTimeout(%q) = %v, want %v", err, got, want)
			}
		})
	}
}

func TestNativePhaseIgnoresOtherTimeouts(t *testing.T) {
	for _, err := range []error{
		context.DeadlineExceeded,
		&net.OpError{Op: "read", Net: "tcp", Err: errors.New("i/o timeout")},
		errors.New("net/http: timeout awaiting something else"),
	} {
		if got := nativePhase(err); got != phaseStart {
			t.Errorf("nativePhase(%v) = %v, want none", err, phaseNames[got])
		}
	}
}

// A connect timeout on the native path is the dialer's own (DNS
// included): it is named, counts the configured limit, and, the request
// having never left, is retried even for a POST.
func TestNativeConnectTimeout(t *testing.T) {
	const limit = 50 * time.Millisecond
	c := NewClient(Config{ConnectTimeout: limit, MaxAttempts: 2, Backoff: backoff.None()})
	tr := c.Transport.(*Transport)
	if !tr.native {
		t.Fatal("NewClient's transport does not take the native path")
	}
	// NewClient's dialer, resolving through a DNS server that never answers.
	var dials atomic.Int64
	hanging := &net.Dialer{Timeout: tr.s.connect, Resolver: hangingResolver()}
	dial := guardDialer(hanging.DialContext, tr.watch, tr.s.write, tr.s.header)
	tr.base.(*http.Transport).DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return dial(ctx, network, addr)
	}
	defer c.CloseIdleConnections()

	start := time.Now()
	resp, err := c.Post("http://never.resolves.test/pay", "text/plain", strings.NewReader("x"))
	elapsed := time.Since(start)
	if resp != nil {
		resp.Body.Close()
		t.Fatal("got a response")
	}
	var te *TimeoutError
	if !errors.As(err, &te) {
		t.Fatalf("err = %v, want a *TimeoutError", err)
	}
	if te.Phase != event.PhaseConnect || te.After != limit || te.Dependency != "never.resolves.test" {
		t.Errorf("timeout = %+v, want connect after %v for never.resolves.test", te, limit)
	}
	if errors.Is(err, guardrail.ErrOutcomeUnknown) {
		t.Errorf("err = %v: a request that never left has a known outcome", err)
	}
	if got := dials.Load(); got != 2 {
		t.Errorf("%d dials, want 2: a POST never sent is retried", got)
	}
	if elapsed < 2*limit || elapsed > 2*limit+time.Second {
		t.Errorf("two attempts took %v, want about %v", elapsed, 2*limit)
	}
}

// hangingResolver answers no DNS query: a lookup lasts until its context
// ends.
func hangingResolver() *net.Resolver {
	return &net.Resolver{
		PreferGo: true,
		Dial: func(ctx context.Context, network, address string) (net.Conn, error) {
			<-ctx.Done()
			return nil, ctx.Err()
		},
	}
}

// HTTPS through NewClient takes the traced path over connections that
// NewClient's dialer wrapped: they carry TLS, so their writes are left
// alone, and requests spaced wider than the write timeout, over HTTP/2 and
// HTTP/1, all go through on one connection.
func TestHTTPSOverWrappedConnections(t *testing.T) {
	for _, h2 := range []bool{true, false} {
		name := "HTTP/1.1"
		if h2 {
			name = "HTTP/2"
		}
		t.Run(name, func(t *testing.T) {
			var conns atomic.Int64
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if got := r.ProtoMajor == 2; got != h2 {
					t.Errorf("request over %s", r.Proto)
				}
				_, _ = w.Write([]byte("ok"))
			}))
			srv.EnableHTTP2 = h2
			srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
				if s == http.StateNew {
					conns.Add(1)
				}
			}
			srv.StartTLS()
			defer srv.Close()
			const limit = 30 * time.Millisecond
			c := NewClient(Config{WriteTimeout: limit})
			base := c.Transport.(*Transport).base.(*http.Transport)
			base.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
			if !h2 {
				base.TLSClientConfig.NextProtos = []string{"http/1.1"}
			}
			defer c.CloseIdleConnections()
			for i := range 3 {
				if i > 0 {
					time.Sleep(3 * limit) // idle longer than the write timeout
				}
				resp, err := c.Get(srv.URL)
				if err != nil {
					t.Fatalf("request %d: %v", i+1, err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK || string(body) != "ok" {
					t.Fatalf("request %d: %d %q, %v", i+1, resp.StatusCode, body, err)
				}
			}
			if got := conns.Load(); got != 1 {
				t.Errorf("server saw %d connections, want 1", got)
			}
		})
	}
}

// deadlineValues writes what deadline.Set writes.
func TestDeadlineValuesMatchDeadlineSet(t *testing.T) {
	now := time.Now()
	for _, d := range []time.Duration{-time.Second, 0, time.Millisecond - 1, time.Millisecond, 1500 * time.Microsecond,
		5 * time.Second, time.Hour, 365 * 24 * time.Hour} {
		h := http.Header{}
		deadline.Set(h, now, d)
		timeout, at := deadlineValues(now, d)
		if timeout != h.Get(deadline.HeaderTimeout) || at != h.Get(deadline.HeaderDeadline) {
			t.Errorf("d = %v: got %q, %q; deadline.Set wrote %q, %q", d, timeout, at,
				h.Get(deadline.HeaderTimeout), h.Get(deadline.HeaderDeadline))
		}
	}
}

// The headers of an attempt are the caller's plus ours, each of ours a
// slice of its own, and the caller's map is left as it was.
func TestAttemptHeaders(t *testing.T) {
	tr := NewTransport(http.DefaultTransport, Config{DeadlineReserve: -1})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://example.test/", nil)
	req.Header.Set("X-Caller", "yes")
	before := req.Header.Clone()
	c := &call{t: tr, req: req, n: 3, idemKey: "k1"}
	dl, need := c.headers(&attempt{})
	if !need || !dl.Equal(func() time.Time { d, _ := ctx.Deadline(); return d }()) {
		t.Fatalf("headers() = %v, %v: want the context's deadline, and headers needed", dl, need)
	}
	var vals [4]string
	h := c.header(dl, time.Now(), &vals)
	for key, want := range map[string]string{"X-Caller": "yes", deadline.HeaderRetryAttempt: "2", HeaderIdempotencyKey: "k1"} {
		if got := h[key]; len(got) != 1 || got[0] != want {
			t.Errorf("%s = %q, want [%q]", key, got, want)
		}
	}
	if d, ok := deadline.ParseTimeout(h.Get(deadline.HeaderTimeout), 0); !ok || d < 59*time.Second || d > time.Minute {
		t.Errorf("%s = %q, want about a minute", deadline.HeaderTimeout, h.Get(deadline.HeaderTimeout))
	}
	h.Add(deadline.HeaderRetryAttempt, "appended") // must not spill into the next key's value
	if got := h[HeaderIdempotencyKey]; len(got) != 1 || got[0] != "k1" {
		t.Errorf("appending to one header changed another: %q", got)
	}
	if len(req.Header) != len(before) || req.Header.Get("X-Caller") != "yes" {
		t.Errorf("caller's headers changed: %v", req.Header)
	}
}

// HTTPS through NewClient takes the traced path, whose timer bounds the
// response header (NewClient's base transport has no
// ResponseHeaderTimeout of its own on the native path): the timeout is
// named, and it is a stream that ends over HTTP/2, not the connection.
func TestHTTPSResponseHeaderTimeoutThroughNewClient(t *testing.T) {
	for _, h2 := range []bool{true, false} {
		name := "HTTP/1.1"
		if h2 {
			name = "HTTP/2"
		}
		t.Run(name, func(t *testing.T) {
			var requests atomic.Int64
			stop := make(chan struct{})
			srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if requests.Add(1) == 1 {
					select { // the first request never gets an answer
					case <-r.Context().Done():
					case <-stop:
					}
					return
				}
				_, _ = w.Write([]byte("ok"))
			}))
			srv.EnableHTTP2 = h2
			srv.StartTLS()
			defer srv.Close()
			defer close(stop)
			const limit = 50 * time.Millisecond
			c := NewClient(Config{ResponseHeaderTimeout: limit, MaxAttempts: 1})
			base := c.Transport.(*Transport).base.(*http.Transport)
			base.TLSClientConfig = srv.Client().Transport.(*http.Transport).TLSClientConfig.Clone()
			if !h2 {
				base.TLSClientConfig.NextProtos = []string{"http/1.1"}
			}
			defer c.CloseIdleConnections()

			_, err := c.Get(srv.URL)
			var te *TimeoutError
			if !errors.As(err, &te) || te.Phase != event.PhaseResponseHeader {
				t.Fatalf("err = %v, want a response_header timeout", err)
			}
			if te.After < limit*9/10 || te.After > limit {
				t.Errorf("After = %v, want about %v", te.After, limit)
			}
			resp, err := c.Get(srv.URL)
			if err != nil {
				t.Fatalf("second request: %v", err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != "ok" {
				t.Errorf("second request: body %q", body)
			}
		})
	}
}
