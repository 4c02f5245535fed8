package guardhttp_test

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// Timing margins: lower bounds are exact (a limit never fires early); upper
// bounds leave room for a loaded machine.
const slack = time.Second

func TestResponseHeaderTimeoutClosesTheConnection(t *testing.T) {
	var requests atomic.Int64
	var srv *server
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		srv.hang(r) // never answers
	})
	rec := &recorder{}
	const limit = 100 * time.Millisecond
	c := newClient(t, guardhttp.Config{
		ResponseHeaderTimeout: limit,
		Retry: guardrail.Retry{
			MaxAttempts: 2,
			Backoff:     backoff.None(),
		},
		Observer: rec,
	})
	start := time.Now()
	resp, err := get(t, context.Background(), c, srv.URL)
	elapsed := time.Since(start)
	te := wantTimeout(t, resp, err, event.PhaseResponseHeader, limit)
	if host := strings.TrimPrefix(srv.URL, "http://"); te.Dependency != host {
		t.Errorf("Dependency = %q, want the host %q", te.Dependency, host)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, guardhttp.ErrTimeout) {
		t.Errorf("err = %v: want it to be context.DeadlineExceeded and guardhttp.ErrTimeout", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Errorf("err = %v: want a net.Error whose Timeout is true", err)
	}
	within(t, "two attempts", elapsed, 2*limit, 2*limit+slack)
	// A GET is idempotent: the timeout was retried once.
	if got := requests.Load(); got != 2 {
		t.Errorf("server saw %d requests, want 2", got)
	}
	// The client gave up on each connection: the server sees both closed.
	srv.waitClosed(t, 2)
	if got, want := rec.count(event.Timeout, func(e event.Event) bool {
		return e.Phase == event.PhaseResponseHeader
	}), 2; got != want {
		t.Errorf("%d timeout events naming the response_header phase, want %d", got, want)
	}
	if got := rec.count(event.Timeout, nil); got != 2 {
		t.Errorf("%d timeout events in all, want one per attempt", got)
	}
}

func TestResponseHeaderTimeoutOfAPostIsOutcomeUnknown(t *testing.T) {
	var requests atomic.Int64
	var srv *server
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		_, _ = io.Copy(io.Discard, r.Body) // net/http notices a closed connection only after the body
		srv.hang(r)
	})
	c := newClient(t, guardhttp.Config{ResponseHeaderTimeout: 50 * time.Millisecond})
	resp, err := c.Post(srv.URL, "text/plain", strings.NewReader("charge 10 EUR"))
	if resp != nil {
		resp.Body.Close()
		t.Fatalf("got a response, want an error")
	}
	if !errors.Is(err, guardrail.ErrOutcomeUnknown) {
		t.Errorf("err = %v, want guardrail.ErrOutcomeUnknown", err)
	}
	if te := asTimeout(t, err); te.Phase != event.PhaseResponseHeader {
		t.Errorf("phase = %s, want %s", te.Phase, event.PhaseResponseHeader)
	}
	if got := requests.Load(); got != 1 {
		t.Errorf("server saw %d requests, want 1: the charge may have gone through", got)
	}
	srv.waitClosed(t, 1)
}

// zeros is an endless body that is not replayable (no GetBody).
type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }

func TestWriteTimeoutAgainstADeafServer(t *testing.T) {
	ln := newDeafListener(t)
	const limit = 200 * time.Millisecond
	c := newClient(t, guardhttp.Config{WriteTimeout: limit, ResponseHeaderTimeout: 10 * time.Second})
	// 64 MiB cannot fit in the socket buffers of a peer that never reads.
	const size = 64 << 20
	req, err := http.NewRequest(http.MethodPut, "http://"+ln.Addr().String()+"/upload", io.LimitReader(zeros{}, size))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	start := time.Now()
	resp, err := c.Do(req)
	elapsed := time.Since(start)
	if resp != nil {
		resp.Body.Close()
		t.Fatal("got a response from a server that never reads")
	}
	te := asTimeout(t, err)
	if te.Phase != event.PhaseWrite {
		t.Fatalf("phase = %s, want %s (err: %v)", te.Phase, event.PhaseWrite, err)
	}
	within(t, "the write", elapsed, limit, limit+slack)
	// The body cannot be sent again (no GetBody, over MaxBufferedBody).
	if got := ln.accepted.Load(); got != 1 {
		t.Errorf("server accepted %d connections, want 1: a body that cannot be replayed is sent once", got)
	}
}

func TestTLSHandshakeTimeoutIsRetriedEvenForAPost(t *testing.T) {
	ln := newDeafListener(t) // accepts TCP, never answers the ClientHello
	const limit = 100 * time.Millisecond
	rec := &recorder{}
	c := newClient(t, guardhttp.Config{
		TLSHandshakeTimeout: limit,
		Retry: guardrail.Retry{
			MaxAttempts: 2,
			Backoff:     backoff.None(),
		},
		Observer: rec,
	})
	start := time.Now()
	resp, err := c.Post("https://"+ln.Addr().String(), "text/plain", strings.NewReader("x"))
	elapsed := time.Since(start)
	if resp != nil {
		resp.Body.Close()
		t.Fatal("got a response")
	}
	if te := asTimeout(t, err); te.Phase != event.PhaseTLS {
		t.Fatalf("phase = %s, want %s (err: %v)", te.Phase, event.PhaseTLS, err)
	}
	if errors.Is(err, guardrail.ErrOutcomeUnknown) {
		t.Errorf("err = %v: a request that never left has a known outcome", err)
	}
	// Nothing was sent: retrying a POST is safe.
	if got := ln.accepted.Load(); got != 2 {
		t.Errorf("server accepted %d connections, want 2", got)
	}
	within(t, "two handshakes", elapsed, 2*limit, 2*limit+slack)
	if got := rec.count(event.Timeout, func(e event.Event) bool { return e.Phase == event.PhaseTLS }); got != 2 {
		t.Errorf("%d tls timeout events, want 2", got)
	}
}

// TestConnectTimeout uses a dialer that never completes: what a dial into
// a black hole (SYNs dropped) looks like to the transport, without relying
// on the network dropping packets for a non-routable address, or on a
// listener's backlog filling up, neither of which loopback does reliably.
func TestConnectTimeout(t *testing.T) {
	release := make(chan struct{})
	var dials atomic.Int64
	base := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			<-release // the transport lets a dial it gave up on run on
			return nil, errors.New("dial released")
		},
	}
	t.Cleanup(func() { close(release); base.CloseIdleConnections() })
	const limit = 100 * time.Millisecond
	rt := newTransport(t, base, guardhttp.Config{ConnectTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 2, Backoff: backoff.None()}})
	req, err := http.NewRequest(http.MethodPost, "http://192.0.2.1/pay", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	resp, err := rt.RoundTrip(req)
	elapsed := time.Since(start)
	if resp != nil {
		t.Fatal("got a response")
	}
	te := asTimeout(t, err)
	if te.Phase != event.PhaseConnect || te.After != limit || te.Dependency != "192.0.2.1" {
		t.Errorf("timeout = %+v, want connect after %v for 192.0.2.1", te, limit)
	}
	// A request that never left is retried, POST or not.
	if got := dials.Load(); got != 2 {
		t.Errorf("%d dials, want 2", got)
	}
	within(t, "two connects", elapsed, 2*limit, 2*limit+slack)
}

func TestConnectionRefusedIsRetriedForAPostAndCountsAsFailure(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	rec := &recorder{}
	c := newClient(t, guardhttp.Config{Retry: guardrail.Retry{Backoff: backoff.None(), Budget: budget.Unlimited()}, Observer: rec})
	resp, err := c.Post("http://"+addr, "application/json", strings.NewReader(`{"amount":10}`))
	if resp != nil {
		resp.Body.Close()
		t.Fatal("got a response from a closed port")
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("err = %v, want connection refused", err)
	}
	if got := rec.count(event.AttemptStart, nil); got != guardrail.DefaultMaxAttempts {
		t.Errorf("%d attempts, want %d: nothing was sent, so a POST is retried", got, guardrail.DefaultMaxAttempts)
	}
	if got := rec.count(event.AttemptEnd, func(e event.Event) bool { return e.Outcome == event.AttemptFailure }); got != guardrail.DefaultMaxAttempts {
		t.Errorf("%d attempts counted as failures, want all %d", got, guardrail.DefaultMaxAttempts)
	}
}

func TestBodyIdleTimeoutWhileReading(t *testing.T) {
	var srv *server
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "1000")
		_, _ = io.WriteString(w, "hello")
		w.(http.Flusher).Flush()
		srv.hang(r) // 995 bytes never come
	})
	rec := &recorder{}
	const limit = 150 * time.Millisecond
	c := newClient(t, guardhttp.Config{BodyIdleTimeout: limit, Observer: rec})
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	buf := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("first read = %q, %v; want hello", buf, err)
	}
	start := time.Now()
	n, err := resp.Body.Read(make([]byte, 100))
	elapsed := time.Since(start)
	if n != 0 {
		t.Errorf("read %d bytes from a stalled body", n)
	}
	if te := asTimeout(t, err); te.Phase != event.PhaseBodyIdle || te.After != limit {
		t.Errorf("timeout = %+v, want body_idle after %v", te, limit)
	}
	within(t, "the stalled read", elapsed, limit, limit+slack)
	srv.waitClosed(t, 1)
	if got := rec.count(event.Timeout, func(e event.Event) bool { return e.Phase == event.PhaseBodyIdle }); got != 1 {
		t.Errorf("%d body_idle timeout events, want 1", got)
	}
}

// A caller that takes its time between Reads is not a stalled server.
func TestBodyIdleCountsOnlyTimeInsideRead(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "0123456789")
	})
	const limit = 50 * time.Millisecond
	c := newClient(t, guardhttp.Config{BodyIdleTimeout: limit})
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b := make([]byte, 1)
	for i := 0; i < 3; i++ {
		if _, err := resp.Body.Read(b); err != nil {
			t.Fatalf("read %d: %v", i, err)
		}
		// The caller is slow on purpose: it works between Reads for longer
		// than the limit. Nothing is being waited for.
		time.Sleep(2 * limit)
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil || string(rest) != "3456789" {
		t.Errorf("rest = %q, %v; want 3456789", rest, err)
	}
}

func TestAttemptTimeoutCoversTheBody(t *testing.T) {
	var srv *server
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "100")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		srv.hang(r)
	})
	const limit = 200 * time.Millisecond
	c := newClient(t, guardhttp.Config{Retry: guardrail.Retry{AttemptTimeout: limit}})
	start := time.Now()
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	_, err = io.ReadAll(resp.Body)
	if te := asTimeout(t, err); te.Phase != event.PhaseAttempt || te.After != limit {
		t.Errorf("timeout = %+v, want attempt after %v", te, limit)
	}
	within(t, "the attempt", time.Since(start), limit, limit+slack)
}

// The caller's deadline is not a phase timeout: it surfaces as the
// context's error, and no attempt starts without MinAttempt left.
func TestCallerDeadline(t *testing.T) {
	var requests atomic.Int64
	var srv *server
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		srv.hang(r)
	})
	c := newClient(t, guardhttp.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 150*time.Millisecond)
	defer cancel()
	_, err := get(t, ctx, c, srv.URL)
	var te *guardhttp.TimeoutError
	if !errors.Is(err, context.DeadlineExceeded) || errors.As(err, &te) {
		t.Errorf("err = %v, want the caller's deadline, not a phase timeout", err)
	}
	if got := requests.Load(); got != 1 {
		t.Errorf("server saw %d requests, want 1", got)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	_, err = get(t, ctx, c, srv.URL)
	if !errors.Is(err, guardrail.ErrDeadline) {
		t.Errorf("err = %v, want guardrail.ErrDeadline: 10 ms is below MinAttempt", err)
	}
	if got := requests.Load(); got != 1 {
		t.Errorf("server saw %d requests, want still 1", got)
	}
}

func TestWriteTimeoutOfAPostIsOutcomeUnknown(t *testing.T) {
	ln := newDeafListener(t)
	c := newClient(t, guardhttp.Config{WriteTimeout: 100 * time.Millisecond})
	const size = 64 << 20
	req, err := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/upload", io.LimitReader(zeros{}, size))
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = size
	_, err = c.Do(req)
	if !errors.Is(err, guardrail.ErrOutcomeUnknown) {
		t.Errorf("err = %v, want guardrail.ErrOutcomeUnknown: part of the request reached the server", err)
	}
	if te := asTimeout(t, err); te.Phase != event.PhaseWrite {
		t.Errorf("phase = %s, want %s", te.Phase, event.PhaseWrite)
	}
}

// NewClient times the writing of a request with a deadline on its
// connection, lifted when the response starts: a connection that stays
// idle for longer than the write timeout is reused as if nothing happened.
func TestIdleConnectionOutlivesTheWriteTimeout(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "ok")
	})
	const limit = 50 * time.Millisecond
	c := newClient(t, guardhttp.Config{WriteTimeout: limit})
	send := func(method string, body io.Reader) {
		t.Helper()
		req, err := http.NewRequest(method, srv.URL, body)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", method, err)
		}
		if got := readAll(t, resp); got != "ok" {
			t.Fatalf("%s: body %q", method, got)
		}
	}
	send(http.MethodGet, nil)
	time.Sleep(3 * limit) // the caller is idle on purpose
	send(http.MethodPut, strings.NewReader("data"))
	time.Sleep(3 * limit)
	send(http.MethodGet, nil)
	if got := srv.newConns.Load(); got != 1 {
		t.Errorf("server saw %d connections, want 1 reused", got)
	}
}

// The wait for the caller's own body counts: the write timeout starts when
// the request has its connection, as the table in docs/http-client.md says.
func TestWriteTimeoutCountsASlowBody(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
	})
	const limit = 50 * time.Millisecond
	c := newClient(t, guardhttp.Config{WriteTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
	body := io.MultiReader(slowReader{3 * limit}, strings.NewReader("data"))
	req, err := http.NewRequest(http.MethodPut, srv.URL, body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 4
	start := time.Now()
	resp, err := c.Do(req)
	if resp != nil {
		resp.Body.Close()
		t.Fatal("got a response")
	}
	if te := asTimeout(t, err); te.Phase != event.PhaseWrite || te.After != limit {
		t.Errorf("timeout = %+v, want write after %v", te, limit)
	}
	within(t, "the request", time.Since(start), limit, 3*limit+slack)
}

// slowReader returns nothing for d, then EOF: a body that takes its time.
type slowReader struct{ d time.Duration }

func (r slowReader) Read([]byte) (int, error) {
	time.Sleep(r.d)
	return 0, io.EOF
}

// A connection switched to another protocol is the caller's, writes
// included: the write timeout no longer applies to it.
func TestSwitchedProtocolsAreNotTimed(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "upgrade to echo", http.StatusUpgradeRequired)
			return
		}
		conn, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
		_ = brw.Flush()
		_, _ = io.Copy(conn, brw) // echo until the client closes
	})
	const limit = 50 * time.Millisecond
	c := newClient(t, guardhttp.Config{WriteTimeout: limit})
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("status %d, want 101", resp.StatusCode)
	}
	rwc, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		t.Fatalf("body %T is not writable", resp.Body)
	}
	// The caller writes at its own pace, longer than the write timeout
	// from the first write to the last.
	for _, msg := range []string{"ping", "pong"} {
		time.Sleep(3 * limit)
		if _, err := io.WriteString(rwc, msg); err != nil {
			t.Fatalf("write %q on the switched connection: %v", msg, err)
		}
	}
	got := make([]byte, len("pingpong"))
	if _, err := io.ReadFull(rwc, got); err != nil || string(got) != "pingpong" {
		t.Fatalf("echo = %q, %v; want pingpong", got, err)
	}
}

// net/http decompresses a gzip body it asked for itself: the body-idle
// timeout ends a stall inside the decompressor's Read too.
func TestBodyIdleTimeoutOfACompressedBody(t *testing.T) {
	var srv *server
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		_, _ = io.WriteString(zw, "hello")
		_ = zw.Flush()
		w.(http.Flusher).Flush()
		srv.hang(r) // the rest of the stream never comes
	})
	const limit = 100 * time.Millisecond
	c := newClient(t, guardhttp.Config{BodyIdleTimeout: limit})
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if !resp.Uncompressed {
		t.Fatal("the transport did not decompress the body: the test needs it to")
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, buf); err != nil || string(buf) != "hello" {
		t.Fatalf("first read = %q, %v; want hello", buf, err)
	}
	start := time.Now()
	_, err = resp.Body.Read(make([]byte, 100))
	if te := asTimeout(t, err); te.Phase != event.PhaseBodyIdle {
		t.Errorf("phase = %s, want %s", te.Phase, event.PhaseBodyIdle)
	}
	within(t, "the stalled read", time.Since(start), limit, limit+slack)
	srv.waitClosed(t, 1)
}
