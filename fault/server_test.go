package fault

import (
	"context"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// upstream is a real loopback server behind the Injector's middleware. It
// counts the handler's runs and signals each handler exit on exited.
type upstream struct {
	srv     *httptest.Server
	in      *Injector
	calls   atomic.Int64
	entered chan struct{} // a request reached the middleware
	exited  chan struct{} // a request left the middleware (even by panic)
	client  *http.Client
}

func newUpstream(t *testing.T, cfg Config, handler http.HandlerFunc) *upstream {
	t.Helper()
	if cfg.Rand == nil {
		cfg.Rand = NewRand(1)
	}
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	u := &upstream{in: in, entered: make(chan struct{}, 100), exited: make(chan struct{}, 100)}
	if handler == nil {
		handler = func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello, world\n") }
	}
	inner := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.calls.Add(1)
		handler(w, r)
	})
	mw := in.Middleware(inner)
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.entered <- struct{}{}
		defer func() { u.exited <- struct{}{} }()
		mw.ServeHTTP(w, r)
	}))
	tr := &http.Transport{}
	u.client = &http.Client{Transport: tr}
	t.Cleanup(func() {
		in.Close()
		tr.CloseIdleConnections()
		u.srv.Close()
	})
	return u
}

func (u *upstream) get(ctx context.Context, t *testing.T, path string) (*http.Response, error) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	return u.client.Do(req)
}

// waitExit waits until the middleware has returned for one request.
func (u *upstream) waitExit(t *testing.T) {
	t.Helper()
	select {
	case <-u.exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the server's handler did not return")
	}
}

func always(f Fault) Config { return Config{Rules: []Rule{{Name: "r", Fault: f}}} }

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestServerReset(t *testing.T) {
	for _, f := range []Fault{Reset{}, Refuse{}} {
		t.Run(string(f.kind()), func(t *testing.T) {
			u := newUpstream(t, always(f), nil)
			start := time.Now()
			resp, err := u.get(t.Context(), t, "/")
			if err == nil {
				resp.Body.Close()
				t.Fatalf("got %s, want a connection reset", resp.Status)
			}
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("err = %v, want ECONNRESET", err)
			}
			if isTimeout(err) {
				t.Fatalf("err = %v is a timeout", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("reset took %v, want it at once", d)
			}
			if got := u.calls.Load(); got != 0 {
				t.Errorf("handler ran %d times, want 0", got)
			}
		})
	}
}

func TestServerStatus(t *testing.T) {
	tests := []struct {
		name   string
		status Status
		check  func(t *testing.T, retryAfter string, sent time.Time)
	}{
		{"plain 500", Status{Code: 500}, func(t *testing.T, ra string, _ time.Time) {
			if ra != "" {
				t.Errorf("Retry-After = %q, want none", ra)
			}
		}},
		{"503 retry after seconds", Status{Code: 503, RetryAfter: 1500 * time.Millisecond},
			func(t *testing.T, ra string, _ time.Time) {
				if ra != "2" {
					t.Errorf("Retry-After = %q, want 2 (rounded up)", ra)
				}
			}},
		{"429 retry after date", Status{Code: 429, RetryAfter: 30 * time.Second, RetryAfterDate: true},
			func(t *testing.T, ra string, sent time.Time) {
				at, err := http.ParseTime(ra)
				if err != nil {
					t.Fatalf("Retry-After = %q is not an HTTP-date: %v", ra, err)
				}
				if d := at.Sub(sent); d < 29*time.Second || d > 32*time.Second {
					t.Errorf("Retry-After is %v after the request, want about 30s", d)
				}
			}},
		{"raw garbage", Status{Code: 503, RetryAfterRaw: "-5"}, func(t *testing.T, ra string, _ time.Time) {
			if ra != "-5" {
				t.Errorf("Retry-After = %q, want -5 verbatim", ra)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpstream(t, always(tt.status), nil)
			sent := time.Now()
			resp, err := u.get(t.Context(), t, "/")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if got, want := resp.StatusCode, tt.status.Code; got != want {
				t.Errorf("status = %d, want %d", got, want)
			}
			if got, want := string(body), http.StatusText(tt.status.Code)+"\n"; got != want {
				t.Errorf("body = %q, want %q", got, want)
			}
			tt.check(t, resp.Header.Get("Retry-After"), sent)
			if got := u.calls.Load(); got != 0 {
				t.Errorf("handler ran %d times, want 0", got)
			}
		})
	}
}

func TestServerHangEndsWithClient(t *testing.T) {
	u := newUpstream(t, always(Hang{}), nil)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	resp, err := u.get(ctx, t, "/")
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %s, want the client to give up", resp.Status)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the client's deadline", err)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Errorf("gave up after %v, before the client's deadline", d)
	}
	u.waitExit(t) // the handler goroutine ends with the client
	if got := u.calls.Load(); got != 0 {
		t.Errorf("handler ran %d times, want 0", got)
	}
}

func TestServerHangReleasedByClose(t *testing.T) {
	u := newUpstream(t, always(Hang{}), nil)
	errc := make(chan error, 1)
	go func() {
		resp, err := u.get(context.Background(), t, "/")
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	<-u.entered
	u.in.Close()
	if err := <-errc; err == nil {
		t.Fatal("got a response from a hung request after Close, want an aborted connection")
	}
	u.waitExit(t)
}

func TestServerLatency(t *testing.T) {
	u := newUpstream(t, always(Latency{Delay: 50 * time.Millisecond}), nil)
	start := time.Now()
	resp, err := u.get(t.Context(), t, "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if d := time.Since(start); d < 50*time.Millisecond {
		t.Errorf("answered after %v, want at least 50ms", d)
	}
	if resp.StatusCode != 200 || u.calls.Load() != 1 {
		t.Errorf("status %d, handler runs %d; want 200 and 1", resp.StatusCode, u.calls.Load())
	}
}

func TestServerLatencyCutByClient(t *testing.T) {
	u := newUpstream(t, always(Latency{Delay: time.Hour}), nil)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	_, err := u.get(ctx, t, "/")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the client's deadline", err)
	}
	u.waitExit(t)
	if got := u.calls.Load(); got != 0 {
		t.Errorf("handler ran %d times after the client left, want 0", got)
	}
}

func TestServerSlowBody(t *testing.T) {
	const body = "0123456789"
	u := newUpstream(t, always(SlowBody{Bytes: 2, Every: 20 * time.Millisecond}),
		func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, body) })
	start := time.Now()
	resp, err := u.get(t.Context(), t, "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var gaps []time.Duration
	var got []byte
	buf := make([]byte, 64)
	last := time.Now()
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			got = append(got, buf[:n]...)
			gaps = append(gaps, time.Since(last))
			last = time.Now()
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	if string(got) != body {
		t.Errorf("body = %q, want %q", got, body)
	}
	if d := time.Since(start); d < 5*20*time.Millisecond {
		t.Errorf("body took %v, want at least 5 pieces × 20ms", d)
	}
	// A loaded client may read two pieces at once; it cannot read it all at once.
	if len(gaps) < 2 {
		t.Errorf("body arrived in %d read(s), want it in pieces", len(gaps))
	}
}

func TestServerStallBody(t *testing.T) {
	u := newUpstream(t, always(StallBody{Bytes: 3}),
		func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "abcdefgh") })
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	resp, err := u.get(ctx, t, "/")
	if err != nil {
		t.Fatalf("headers should arrive: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("status = %d, want 200", resp.StatusCode)
	}
	got, err := io.ReadAll(resp.Body)
	if string(got) != "abc" {
		t.Errorf("body before the stall = %q, want %q", got, "abc")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("read err = %v, want the client's deadline", err)
	}
	u.waitExit(t)
}

func TestServerTruncate(t *testing.T) {
	body := strings.Repeat("x", 100)
	tests := []struct {
		name     string
		fault    Truncate
		declare  bool // the handler sets Content-Length
		body     string
		wantCL   int64
		wantRead int
	}{
		{"buffered half", Truncate{}, false, body, 100, 50},
		{"streamed half", Truncate{}, true, body, 100, 50},
		{"streamed 10 bytes", Truncate{Bytes: 10}, true, body, 100, 10},
		{"bytes past the end", Truncate{Bytes: 1000}, false, body, 100, 99},
		{"empty body", Truncate{}, false, "", 1, 0},
		{"window", Truncate{}, false, strings.Repeat("x", truncWindow), truncWindow, truncWindow / 2},
		{"past the window", Truncate{Bytes: 10}, false, strings.Repeat("x", truncWindow+1), -1, 10},
		{"past the window, half", Truncate{}, false, strings.Repeat("x", 3*truncWindow), -1, truncWindow / 2},
		{"past the window, bytes past the end", Truncate{Bytes: 1 << 20}, false, strings.Repeat("x", truncWindow+1), -1, truncWindow},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			u := newUpstream(t, always(tt.fault), func(w http.ResponseWriter, r *http.Request) {
				if tt.declare {
					w.Header().Set("Content-Length", strconv.Itoa(len(tt.body)))
				}
				io.WriteString(w, tt.body)
			})
			resp, err := u.get(t.Context(), t, "/")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.ContentLength != tt.wantCL {
				t.Errorf("Content-Length = %d, want %d", resp.ContentLength, tt.wantCL)
			}
			got, err := io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("read err = %v, want io.ErrUnexpectedEOF", err)
			}
			if len(got) != tt.wantRead {
				t.Errorf("read %d bytes, want %d", len(got), tt.wantRead)
			}
			if u.calls.Load() != 1 {
				t.Errorf("handler ran %d times, want 1", u.calls.Load())
			}
		})
	}
}

func TestServerLoseResponse(t *testing.T) {
	var committed atomic.Int64
	u := newUpstream(t, always(LoseResponse{}), func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		committed.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":1}`)
	})
	resp, err := u.client.Post(u.srv.URL+"/orders", "application/json", strings.NewReader(`{"sku":"a"}`))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got %s, want the response lost", resp.Status)
	}
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("err = %v, want ECONNRESET", err)
	}
	if got := committed.Load(); got != 1 {
		t.Errorf("handler committed %d times, want exactly 1", got)
	}
}

func TestServerMatchAndCounters(t *testing.T) {
	cfg := Config{Rules: []Rule{
		{Name: "slow", Match: Match{Path: "/api/**"}, Fault: Latency{Delay: time.Millisecond}},
		{Name: "teapot", Match: Match{Methods: []string{"get"}, Path: "/api/*/brew"}, Fault: Status{Code: 418}},
		{Name: "off", Disabled: true, Fault: Reset{}},
	}}
	u := newUpstream(t, cfg, nil)
	for _, tt := range []struct {
		path string
		want int
	}{
		{"/api/pot/brew", 418}, {"/api/pot/brew", 418}, {"/api/pot", 200}, {"/other", 200},
	} {
		resp, err := u.get(t.Context(), t, tt.path)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tt.want {
			t.Errorf("GET %s = %d, want %d", tt.path, resp.StatusCode, tt.want)
		}
	}
	want := []Counter{
		{Rule: "slow", Kind: kindLatency, Matched: 3, Fired: 3},
		{Rule: "teapot", Kind: kindError, Matched: 2, Fired: 2},
		{Rule: "off", Kind: kindReset, Matched: 0, Fired: 0},
	}
	got := u.in.Counters()
	if len(got) != len(want) {
		t.Fatalf("counters = %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("counter %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if u.calls.Load() != 2 {
		t.Errorf("handler ran %d times, want 2", u.calls.Load())
	}
}

func TestServerHeaderFaults(t *testing.T) {
	var seen atomic.Value
	handler := func(w http.ResponseWriter, r *http.Request) {
		seen.Store(r.Header.Get("X-Fault"))
		io.WriteString(w, "ok")
	}
	do := func(u *upstream, value string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), "GET", u.srv.URL, nil)
		req.Header.Set("X-Fault", value)
		resp, err := u.client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	t.Run("off by default", func(t *testing.T) {
		u := newUpstream(t, Config{}, handler)
		if got := do(u, "error; status=500"); got != 200 {
			t.Errorf("status = %d, want 200: header faults must be off by default", got)
		}
	})
	t.Run("on", func(t *testing.T) {
		u := newUpstream(t, Config{HeaderFaults: true}, handler)
		if got := do(u, "error; status=429; retry_after=1s"); got != 429 {
			t.Errorf("status = %d, want 429", got)
		}
		if got := do(u, "latency; delay=1ms"); got != 200 {
			t.Errorf("status = %d, want 200", got)
		}
		if v := seen.Load(); v != "" {
			t.Errorf("handler saw X-Fault %q, want it stripped", v)
		}
		if got := do(u, "explode"); got != 400 {
			t.Errorf("bad header: status = %d, want 400", got)
		}
		if got := do(u, "error; path=/x"); got != 400 {
			t.Errorf("match key in header: status = %d, want 400", got)
		}
		fired := u.in.Counters()
		want := []Counter{{headerRule, kindLatency, 1, 1}, {headerRule, kindError, 1, 1}}
		if len(fired) != 2 || fired[0] != want[0] || fired[1] != want[1] {
			t.Errorf("counters = %+v, want %+v", fired, want)
		}
	})
}

func TestServerEdgeCases(t *testing.T) {
	t.Run("status zero value is 503", func(t *testing.T) {
		u := newUpstream(t, always(Status{}), nil)
		resp, err := u.get(t.Context(), t, "/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("status = %d, want 503", resp.StatusCode)
		}
	})
	t.Run("truncate HEAD is cut before the headers", func(t *testing.T) {
		u := newUpstream(t, always(Truncate{}), nil)
		resp, err := u.client.Head(u.srv.URL)
		if err == nil {
			resp.Body.Close()
			t.Fatalf("got %s, want the connection cut", resp.Status)
		}
		if u.calls.Load() != 0 {
			t.Errorf("handler ran %d times, want 0", u.calls.Load())
		}
	})
	t.Run("truncate 204 is cut before the headers", func(t *testing.T) {
		u := newUpstream(t, always(Truncate{}), func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusNoContent)
		})
		resp, err := u.get(t.Context(), t, "/")
		if err == nil {
			resp.Body.Close()
			t.Fatalf("got %s, want the connection cut", resp.Status)
		}
		if u.calls.Load() != 1 {
			t.Errorf("handler ran %d times, want 1", u.calls.Load())
		}
	})
	t.Run("stall without a body still stalls", func(t *testing.T) {
		u := newUpstream(t, always(StallBody{}), func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Answer", "42")
		})
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		resp, err := u.get(ctx, t, "/")
		if err != nil {
			t.Fatalf("headers should arrive: %v", err)
		}
		defer resp.Body.Close()
		if resp.Header.Get("X-Answer") != "42" {
			t.Errorf("headers = %v", resp.Header)
		}
		if _, err := io.ReadAll(resp.Body); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("read err = %v, want the client's deadline", err)
		}
		u.waitExit(t)
	})
}

// A request whose body the server never read is not watched for a client
// disconnect by net/http; the hang must still end with the client.
func TestServerHangWithUnreadBodyEndsWithClient(t *testing.T) {
	for _, f := range []Fault{Hang{}, StallBody{}} {
		t.Run(string(f.kind()), func(t *testing.T) {
			u := newUpstream(t, always(f), func(w http.ResponseWriter, r *http.Request) {})
			ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "POST", u.srv.URL, strings.NewReader(strings.Repeat("x", 1<<16)))
			resp, err := u.client.Do(req)
			if err == nil {
				_, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("err = %v, want the client's deadline", err)
			}
			u.waitExit(t)
		})
	}
}

// A chunked upstream far larger than what the truncate fault sends, behind
// a reverse proxy as in fault-proxy: the fault streams the cut instead of
// buffering the body, so the proxy stops reading the upstream soon after
// the cut and memory stays bounded.
func TestServerTruncateLargeChunkedBody(t *testing.T) {
	const bodySize = 256 << 20
	tests := []struct {
		name     string
		fault    Truncate
		wantRead int
	}{
		{"10 bytes", Truncate{Bytes: 10}, 10},
		{"past the window", Truncate{Bytes: 100 << 10}, 100 << 10},
		{"half", Truncate{}, truncWindow / 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var wrote atomic.Int64
			chunk := []byte(strings.Repeat("0123456789abcdef", 2048)) // 32 KiB
			origin := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "application/octet-stream")
				for wrote.Load() < bodySize {
					n, err := w.Write(chunk)
					wrote.Add(int64(n))
					if err != nil {
						return
					}
				}
			}))
			defer origin.Close()
			target, _ := url.Parse(origin.URL)
			tr := &http.Transport{}
			defer tr.CloseIdleConnections()
			proxy := httputil.NewSingleHostReverseProxy(target)
			proxy.Transport = tr
			proxy.ErrorLog = log.New(io.Discard, "", 0)
			u := newUpstream(t, always(tt.fault), proxy.ServeHTTP)

			var before, after runtime.MemStats
			runtime.GC()
			runtime.ReadMemStats(&before)
			resp, err := u.get(t.Context(), t, "/")
			if err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			u.waitExit(t)
			runtime.ReadMemStats(&after)
			t.Logf("client read %d bytes; upstream wrote %d KiB of %d MiB; allocated %d KiB",
				len(got), wrote.Load()>>10, bodySize>>20, (after.TotalAlloc-before.TotalAlloc)>>10)

			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("read err = %v, want io.ErrUnexpectedEOF", err)
			}
			if len(got) != tt.wantRead {
				t.Errorf("read %d bytes, want %d", len(got), tt.wantRead)
			}
			if string(got[:min(len(got), 10)]) != "0123456789" {
				t.Errorf("body starts %q, want the upstream's bytes", got[:min(len(got), 10)])
			}
			// The upstream stops once the proxy gives up its connection; what
			// it wrote past the cut sits in socket buffers, far below the body.
			origin.Close()
			if w := wrote.Load(); w > 32<<20 {
				t.Errorf("upstream wrote %d MiB of %d MiB; the proxy read on after the cut", w>>20, bodySize>>20)
			}
			if d := after.TotalAlloc - before.TotalAlloc; d > 32<<20 {
				t.Errorf("allocated %d MiB for a %d MiB body cut at %d bytes", d>>20, bodySize>>20, tt.wantRead)
			}
		})
	}
}
