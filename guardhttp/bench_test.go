package guardhttp_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// BenchmarkClient compares a plain http.Client with guardhttp.NewClient on
// a loopback server, in one run: the success path of a GET. Each client
// gets a server of its own, warmed up, and leaves nothing behind (idle
// connections, their goroutines and timers) for the next to pay for. Run
// the binary several times with -count 1 rather than once with -count n,
// which runs each sub-benchmark n times in a row and so compares clients
// measured minutes apart on a machine whose load moves (see
// docs/http-client.md).
//
// "timeouts" is a plain client with net/http's own response header
// timeout too, as a careful user configures one without guardhttp: the
// difference with it is what bounding the phases the guard's way costs
// over net/http's (see docs/http-client.md).
//
// With a deadline, guardhttp sends it to the server (X-Request-Timeout,
// X-Request-Deadline), which a plain client does not: "wire" is a plain
// client whose requests carry the same two headers, ready-made, to tell
// what propagating a deadline costs the wire and the server from what the
// guard costs.
func BenchmarkClient(b *testing.B) {
	clients := []struct {
		name      string
		newClient func() *http.Client
		headers   bool // the request carries the deadline headers
	}{
		{"plain", func() *http.Client { return &http.Client{Transport: plainTransport()} }, false},
		{"timeouts", func() *http.Client {
			t := plainTransport()
			t.ResponseHeaderTimeout = guardhttp.DefaultResponseHeaderTimeout
			return &http.Client{Transport: t}
		}, false},
		{"wire", func() *http.Client { return &http.Client{Transport: plainTransport()} }, true},
		{"floor", func() *http.Client {
			return &http.Client{Transport: floor{plainTransport()}}
		}, false},
		{"guardhttp", func() *http.Client { return guardClient(b) }, false},
	}
	// Each run starts with another client, so that over several runs none
	// is always measured first or last.
	first := os.Getpid() % len(clients)
	clients = append(clients[first:], clients[:first]...)
	for _, withDeadline := range []bool{false, true} {
		for _, c := range clients {
			if c.headers && !withDeadline {
				continue
			}
			name := "deadline=none/client=" + c.name
			if withDeadline {
				name = "deadline=1h/client=" + c.name
			}
			b.Run(name, func(b *testing.B) {
				srv := okServer(b)
				client := c.newClient()
				defer client.CloseIdleConnections()
				req := benchGet(b, srv.URL, withDeadline, c.headers)
				do := func() { send(b, client, req) }
				for range 1000 { // connection, pools and caches warm
					do()
				}
				runtime.GC()
				b.ReportAllocs()
				cpu := cpuTime()
				for b.Loop() {
					do()
				}
				reportCPU(b, cpu)
			})
		}
	}
}

// floor is the least any transport pays to bound the phases of a request
// with net/http's own means: a cancellable context per request and two
// httptrace hooks that read the clock. It enforces nothing.
type floor struct{ base http.RoundTripper }

func (f floor) RoundTrip(r *http.Request) (*http.Response, error) {
	ctx, cancel := context.WithCancelCause(r.Context())
	var last atomic.Int64
	trace := &httptrace.ClientTrace{
		GotConn:      func(httptrace.GotConnInfo) { last.Store(time.Now().UnixNano()) },
		WroteRequest: func(httptrace.WroteRequestInfo) { last.Store(time.Now().UnixNano()) },
	}
	resp, err := f.base.RoundTrip(r.WithContext(httptrace.WithClientTrace(ctx, trace)))
	if err != nil {
		cancel(err)
		return nil, err
	}
	resp.Body = cancelOnClose{resp.Body, cancel}
	return resp, nil
}

type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (c cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel(nil)
	return err
}

func (f floor) CloseIdleConnections() { f.base.(*http.Transport).CloseIdleConnections() }

// cpuTime is the CPU time this process used so far, client and server
// together. On a shared machine it is steadier than the wall clock, which
// also counts the time other processes held the cores.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the CPU time per operation since start.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime()-start)/float64(b.N), "cpu-ns/op")
}

// fakeTransport answers at once, reporting its phases through httptrace as
// *http.Transport does, so BenchmarkOverhead measures the guard alone.
type fakeTransport struct{}

func (fakeTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if tr := httptrace.ContextClientTrace(r.Context()); tr != nil {
		if tr.GetConn != nil {
			tr.GetConn(r.URL.Host)
		}
		if tr.GotConn != nil {
			tr.GotConn(httptrace.GotConnInfo{Reused: true})
		}
		if tr.WroteRequest != nil {
			tr.WroteRequest(httptrace.WroteRequestInfo{})
		}
	}
	return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
}

// BenchmarkOverhead is the guard's own cost per request: a Transport over a
// transport that answers at once, against that transport alone.
func BenchmarkOverhead(b *testing.B) {
	req, err := http.NewRequest(http.MethodGet, "http://example.invalid/", nil)
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		rt   http.RoundTripper
	}{
		{"bare", fakeTransport{}},
		{"guardhttp", must(guardhttp.NewTransport(fakeTransport{}, guardhttp.Config{}))},
	} {
		b.Run("rt="+c.name, func(b *testing.B) {
			b.ReportAllocs()
			cpu := cpuTime()
			for b.Loop() {
				resp, err := c.rt.RoundTrip(req)
				if err != nil {
					b.Fatal(err)
				}
				resp.Body.Close()
			}
			reportCPU(b, cpu)
		})
	}
}

// BenchmarkClientPaired sends the same GET to one loopback server with
// several clients in turn, alternating blocks of requests between them, so
// that all see the same machine at almost the same moment, and reports the
// time per request of each and guardhttp's overhead in percent over plain
// (net/http alone, as the issue asks), over timeouts (plus net/http's own
// response-header timeout, as a careful user sets up without guardhttp)
// and, with a deadline, over wire (a plain client whose requests carry the
// deadline headers, ready-made). On a shared machine whose load drifts, a
// ratio taken this way varies far less than one between benchmarks run
// seconds apart.
func BenchmarkClientPaired(b *testing.B) {
	for _, withDeadline := range []bool{false, true} {
		name := "deadline=none"
		if withDeadline {
			name = "deadline=1h"
		}
		b.Run(name, func(b *testing.B) {
			srv := okServer(b)
			newReq := func(headers bool) *http.Request { return benchGet(b, srv.URL, withDeadline, headers) }
			timeouts := plainTransport()
			timeouts.ResponseHeaderTimeout = guardhttp.DefaultResponseHeaderTimeout
			type client struct {
				name string
				c    *http.Client
				req  *http.Request
			}
			clients := []client{
				{"plain", &http.Client{Transport: plainTransport()}, newReq(false)},
				{"timeouts", &http.Client{Transport: timeouts}, newReq(false)},
				{"guard", guardClient(b), newReq(false)},
			}
			if withDeadline {
				clients = append(clients, client{"wire", &http.Client{Transport: plainTransport()}, newReq(true)})
			}
			do := func(c client) { send(b, c.c, c.req) }
			for _, c := range clients {
				defer c.c.CloseIdleConnections()
				for range 1000 {
					do(c)
				}
			}
			const block = 50
			spent := make([]time.Duration, len(clients))
			n := make([]int, len(clients))
			runtime.GC()
			i := 0
			for b.Loop() {
				k := (i / block) % len(clients)
				start := time.Now()
				do(clients[k])
				spent[k] += time.Since(start)
				n[k]++
				i++
			}
			per := map[string]float64{}
			for k, c := range clients {
				if n[k] == 0 {
					return
				}
				per[c.name] = float64(spent[k]) / float64(n[k])
				b.ReportMetric(per[c.name], c.name+"-ns/req")
			}
			g := per["guard"]
			b.ReportMetric(100*(g-per["plain"])/per["plain"], "vs-plain-%")
			b.ReportMetric(100*(g-per["timeouts"])/per["timeouts"], "vs-timeouts-%")
			if w, ok := per["wire"]; ok {
				b.ReportMetric(100*(g-w)/w, "vs-wire-%")
			}
		})
	}
}

// plainTransport is what a careful user builds without guardhttp: the
// connection pool NewClient builds for itself (HTTP/2 when offered, 64
// idle connections per host, proxies from the environment, a bounded dial
// and TLS handshake), and nothing else.
func plainTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: guardhttp.DefaultConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4 * guardhttp.DefaultMaxIdleConnsPerHost,
		MaxIdleConnsPerHost:   guardhttp.DefaultMaxIdleConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   guardhttp.DefaultTLSHandshakeTimeout,
		ExpectContinueTimeout: time.Second,
	}
}

// guardClient is guardhttp.NewClient(guardhttp.Config{}).
func guardClient(b *testing.B) *http.Client {
	c, err := guardhttp.NewClient(guardhttp.Config{})
	if err != nil {
		b.Fatal(err)
	}
	return c
}

// okServer starts a loopback server that answers "ok", closed when b ends.
func okServer(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	b.Cleanup(srv.Close)
	return srv
}

// benchGet returns a GET of url, under a context with an hour left if
// withDeadline, carrying the deadline headers ready-made if headers.
func benchGet(b *testing.B, url string, withDeadline, headers bool) *http.Request {
	ctx := context.Background()
	if withDeadline {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Hour)
		b.Cleanup(cancel)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		b.Fatal(err)
	}
	if headers {
		deadline.Set(req.Header, time.Now(), time.Hour)
	}
	return req
}

// send sends req with c and reads its body to the end.
func send(b *testing.B, c *http.Client, req *http.Request) {
	resp, err := c.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}
