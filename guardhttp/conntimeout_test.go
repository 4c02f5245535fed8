package guardhttp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/guardhttp"
)

// On a reused connection, a response that never starts ends the attempt
// at the response-header limit, once: net/http sends a request again by
// itself when a reused connection fails before the first byte of the
// response, but never one whose context was cancelled.
func TestResponseHeaderTimeoutOnAReusedConnectionIsNotSentAgain(t *testing.T) {
	var requests atomic.Int64
	var srv *server
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if requests.Add(1) == 2 {
			srv.hang(r)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	const limit = 150 * time.Millisecond
	c := newClient(t, guardhttp.Config{ResponseHeaderTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
	resp, err := get(t, context.Background(), c, srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); body != "ok" {
		t.Fatalf("first body %q", body)
	}
	start := time.Now()
	resp, err = get(t, context.Background(), c, srv.URL)
	elapsed := time.Since(start)
	wantTimeout(t, resp, err, event.PhaseResponseHeader, limit)
	within(t, "one response-header timeout", elapsed, limit, limit+limit/2+slack/4)
	if got := requests.Load(); got != 2 {
		t.Errorf("server saw %d requests, want 2: the timed-out one was sent again", got)
	}
	if got := srv.newConns.Load(); got != 1 {
		t.Errorf("server saw %d connections, want 1: the second request reused the first", got)
	}
	srv.waitClosed(t, 1)
}

// Headers that start in time and then stall are bounded by the same
// limit, wherever they stop: the phase lasts until the end of the headers.
func TestResponseHeaderTimeoutCoversHeadersThatStall(t *testing.T) {
	const limit = 150 * time.Millisecond
	for _, sent := range []string{
		"HTTP/1.1 20",
		"HTTP/1.1 200 OK\r\n",
		"HTTP/1.1 200 OK\r\nContent-Le",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r",
		"HTTP/1.1 103 Early Hints\r\n\r\nHTTP/1.1 2",
	} {
		t.Run(strings.ReplaceAll(sent, "\r\n", "|"), func(t *testing.T) {
			ln := newScriptedServer(t, func(req []byte, w io.Writer, stop <-chan struct{}) {
				_, _ = io.WriteString(w, sent)
				<-stop
			})
			c := newClient(t, guardhttp.Config{ResponseHeaderTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
			start := time.Now()
			resp, err := get(t, context.Background(), c, "http://"+ln.addr)
			elapsed := time.Since(start)
			wantTimeout(t, resp, err, event.PhaseResponseHeader, limit)
			within(t, "stalled headers", elapsed, limit, limit+slack)
		})
	}
}

// An interim response does not end the wait for the final one: a 103
// followed by a final response too late is a response-header timeout, and
// one followed in time by the final response succeeds.
func TestInterimResponsesDoNotEndTheHeaderPhase(t *testing.T) {
	const limit = 200 * time.Millisecond
	for _, tt := range []struct {
		name  string
		delay time.Duration // between the 103 and the final response
		ok    bool
	}{
		{"final in time", 0, true},
		{"final too late", 10 * limit, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var srv *server
			srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Link", "</style.css>; rel=preload")
				w.WriteHeader(http.StatusEarlyHints)
				select {
				case <-time.After(tt.delay):
				case <-r.Context().Done():
					return
				case <-srv.stop:
					return
				}
				_, _ = io.WriteString(w, "final")
			})
			c := newClient(t, guardhttp.Config{ResponseHeaderTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
			start := time.Now()
			resp, err := get(t, context.Background(), c, srv.URL)
			elapsed := time.Since(start)
			if tt.ok {
				if err != nil {
					t.Fatal(err)
				}
				if body := readAll(t, resp); body != "final" {
					t.Errorf("body %q, want the final response's", body)
				}
				return
			}
			wantTimeout(t, resp, err, event.PhaseResponseHeader, limit)
			within(t, "103 then nothing", elapsed, limit, limit+slack)
		})
	}
}

// A request that asks for 100 Continue sends its body once the server
// asks for it; the wait for the 100 is part of the write phase, which ends
// when the body is written: here the server waits most of the write limit
// before asking, and the body still goes through.
func TestExpectContinue(t *testing.T) {
	const limit = 300 * time.Millisecond
	var got atomic.Value
	var srv *server
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(limit * 2 / 3):
		case <-srv.stop:
			return
		}
		b, _ := io.ReadAll(r.Body) // asks for the body: 100 Continue
		got.Store(string(b))
		_, _ = io.WriteString(w, "stored")
	})
	c := newClient(t, guardhttp.Config{WriteTimeout: limit, ResponseHeaderTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
	body := strings.Repeat("x", 1<<10)
	req, err := http.NewRequest(http.MethodPut, srv.URL, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Expect", "100-continue")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if b := readAll(t, resp); b != "stored" {
		t.Errorf("response %q", b)
	}
	if s, _ := got.Load().(string); s != body {
		t.Errorf("server got %d bytes, want %d", len(s), len(body))
	}
}

// scriptedServer accepts connections, reads a request's headers from each
// and lets a script answer with raw bytes.
type scriptedServer struct {
	addr string
}

func newScriptedServer(t *testing.T, script func(req []byte, w io.Writer, stop <-chan struct{})) *scriptedServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	t.Cleanup(func() {
		close(stop)
		ln.Close()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer conn.Close()
				go func() { <-stop; conn.Close() }()
				var req []byte
				buf := make([]byte, 4096)
				for !bytes.Contains(req, []byte("\r\n\r\n")) {
					n, err := conn.Read(buf)
					if err != nil {
						return
					}
					req = append(req, buf[:n]...)
				}
				script(req, conn, stop)
			}()
		}
	}()
	return &scriptedServer{addr: ln.Addr().String()}
}

// Many requests at once over pooled connections, half answered at once and
// half far too late: exactly the late ones time out, in their
// response-header phase, and the server sees each request once (none is
// sent again behind the caller's back).
func TestTimeoutsUnderConcurrency(t *testing.T) {
	const (
		// Far above what a fast answer takes even on two busy cores, under
		// the race detector, with a hundred connections opening at once.
		limit    = 400 * time.Millisecond
		requests = 100
	)
	var seen sync.Map // path -> count
	var srv *server
	srv = newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n, _ := seen.LoadOrStore(r.URL.Path, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if strings.HasPrefix(r.URL.Path, "/slow/") {
			srv.hang(r)
			return
		}
		_, _ = io.WriteString(w, "ok")
	})
	c := newClient(t, guardhttp.Config{ResponseHeaderTimeout: limit, Retry: guardrail.Retry{MaxAttempts: 1}})
	type result struct {
		slow bool
		err  error
		body string
	}
	results := make(chan result, requests)
	var wg sync.WaitGroup
	for i := range requests {
		slow := i%2 == 1
		path := fmt.Sprintf("/fast/%d", i)
		if slow {
			path = fmt.Sprintf("/slow/%d", i)
		}
		wg.Go(func() {
			resp, err := get(t, context.Background(), c, srv.URL+path)
			r := result{slow: slow, err: err}
			if err == nil {
				r.body = readAll(t, resp)
			}
			results <- r
		})
	}
	wg.Wait()
	close(results)
	var fastOK, slowTimedOut int
	for r := range results {
		switch {
		case !r.slow && r.err == nil && r.body == "ok":
			fastOK++
		case r.slow && r.err != nil:
			var te *guardhttp.TimeoutError
			if errors.As(r.err, &te) && te.Phase == event.PhaseResponseHeader {
				slowTimedOut++
			} else {
				t.Errorf("slow request: %v, want a response-header timeout", r.err)
			}
		default:
			t.Errorf("slow=%v: body %q, err %v", r.slow, r.body, r.err)
		}
	}
	if fastOK != requests/2 || slowTimedOut != requests/2 {
		t.Errorf("%d fast requests answered, %d slow ones timed out; want %d each", fastOK, slowTimedOut, requests/2)
	}
	seen.Range(func(path, n any) bool {
		if got := n.(*atomic.Int64).Load(); got != 1 {
			t.Errorf("server saw %s %d times, want once", path, got)
		}
		return true
	})
}
