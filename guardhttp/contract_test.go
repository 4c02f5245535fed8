package guardhttp_test

// Contract tests: each pins one behaviour of net/http that guardhttp's
// phase timeouts rest on, with net/http alone, so that a Go release that
// changes it fails here, by name, rather than as a timeout that no longer
// fires somewhere else.

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// cancelAfter cancels ctx d after the hook it is called from.
func cancelAfter(d time.Duration, cancel context.CancelFunc) { time.AfterFunc(d, cancel) }

// Cancelling a request's context ends its round trip, whatever phase it
// is in: "For outgoing client requests, the context controls the entire
// lifetime of a request and its response: obtaining a connection, sending
// the request, and reading the response headers and body." guardhttp ends
// every phase that way.
func TestContractCancelEndsEveryPhase(t *testing.T) {
	const after = 50 * time.Millisecond
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			roundTrip := func(t *testing.T, base *http.Transport, req *http.Request) (*http.Response, time.Duration, error) {
				start := time.Now()
				resp, err := base.RoundTrip(req)
				return resp, time.Since(start), err
			}
			t.Run("connect", func(t *testing.T) {
				tg := r.start(t, func(http.ResponseWriter, *http.Request) {})
				stop := make(chan struct{})
				t.Cleanup(func() { close(stop) })
				tg.base.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
					select { // a dial may outlive the request: it waits for the test
					case <-stop:
					case <-ctx.Done():
					}
					return nil, errors.New("no dial")
				}
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
					GetConn: func(string) { cancelAfter(after, cancel) },
				}), http.MethodGet, tg.url, nil)
				resp, took, err := roundTrip(t, tg.base, req)
				wantEnded(t, resp, err, took, after)
			})
			if r.https {
				t.Run("tls", func(t *testing.T) {
					tg := r.start(t, func(http.ResponseWriter, *http.Request) {})
					deaf := newDeafListener(t)
					u, _ := url.Parse(tg.url)
					u.Host = deaf.Addr().String()
					ctx, cancel := context.WithCancel(context.Background())
					defer cancel()
					req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
						TLSHandshakeStart: func() { cancelAfter(after, cancel) },
					}), http.MethodGet, u.String(), nil)
					resp, took, err := roundTrip(t, tg.base, req)
					wantEnded(t, resp, err, took, after)
				})
			}
			t.Run("write", func(t *testing.T) {
				var tg *target
				tg = r.start(t, func(w http.ResponseWriter, req *http.Request) { tg.hang(req) })
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
					GotConn: func(httptrace.GotConnInfo) { cancelAfter(after, cancel) },
				}), http.MethodPut, tg.url, endless{})
				resp, took, err := roundTrip(t, tg.base, req)
				wantEnded(t, resp, err, took, after)
			})
			t.Run("response_header", func(t *testing.T) {
				var tg *target
				tg = r.start(t, func(w http.ResponseWriter, req *http.Request) { tg.hang(req) })
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
					WroteRequest: func(httptrace.WroteRequestInfo) { cancelAfter(after, cancel) },
				}), http.MethodGet, tg.url, nil)
				resp, took, err := roundTrip(t, tg.base, req)
				wantEnded(t, resp, err, took, after)
			})
			t.Run("body", func(t *testing.T) {
				var tg *target
				tg = r.start(t, func(w http.ResponseWriter, req *http.Request) {
					_, _ = io.WriteString(w, "start")
					_ = http.NewResponseController(w).Flush()
					tg.hang(req)
				})
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, tg.url, nil)
				resp, err := tg.base.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				cancelAfter(after, cancel)
				start := time.Now()
				_, err = io.ReadAll(resp.Body)
				if err == nil {
					t.Fatal("reading the body: no error after the context was cancelled")
				}
				within(t, "a Read after cancel", time.Since(start), after, after+slack)
			})
		})
	}
}

// wantEnded fails the test unless the round trip failed, promptly after
// its context was cancelled after d.
func wantEnded(t *testing.T, resp *http.Response, err error, took, d time.Duration) {
	t.Helper()
	if err == nil {
		resp.Body.Close()
		t.Fatal("the round trip succeeded after its context was cancelled")
	}
	within(t, "the round trip after cancel", took, d, d+slack)
}

// A request whose context is cancelled before the first byte of its
// response is not sent again by the transport, even on a reused
// connection (which it otherwise resends after some failures): a phase
// timeout costs the server one request.
func TestContractCancelledRequestIsNotResent(t *testing.T) {
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			var requests atomic.Int64
			var tg *target
			tg = r.start(t, func(w http.ResponseWriter, req *http.Request) {
				if requests.Add(1) == 2 {
					tg.hang(req)
					return
				}
				_, _ = io.WriteString(w, "ok")
			})
			c := &http.Client{Transport: tg.base}
			resp, err := c.Get(tg.url)
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var reused bool
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
				GotConn:      func(i httptrace.GotConnInfo) { reused = i.Reused },
				WroteRequest: func(httptrace.WroteRequestInfo) { cancelAfter(50*time.Millisecond, cancel) },
			}), http.MethodGet, tg.url, nil)
			if _, err := c.Do(req); err == nil {
				t.Fatal("the cancelled request succeeded")
			}
			if !reused {
				t.Error("the second request did not reuse the connection")
			}
			// A third request: had the second been sent again, the server
			// would have seen it before this one on HTTP/2's one
			// connection, or in the same round trip on HTTP/1's.
			resp, err = c.Get(tg.url)
			if err != nil {
				t.Fatal(err)
			}
			readAll(t, resp)
			if got := requests.Load(); got != 3 {
				t.Errorf("server saw %d requests, want 3: the cancelled one was sent again", got)
			}
		})
	}
}

// *http.Transport reports the phases through httptrace in order: it asks
// for a connection first (GetConn), then for a new TLS connection starts
// a handshake (TLSHandshakeStart), gets the connection (GotConn), reports
// the request written once the whole body has been read (WroteRequest).
// The response comes after GotConn; it may come before WroteRequest is
// reported (the writer and the reader of a connection run apart, on both
// protocols), which the attempt's phases allow: a late WroteRequest after
// the headers changes nothing. A cleartext request without a proxy takes
// no handshake, and the transport asks its Proxy about each request.
func TestContractTraceOrder(t *testing.T) {
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			tg := r.start(t, func(w http.ResponseWriter, req *http.Request) {
				_, _ = io.Copy(io.Discard, req.Body)
				_, _ = io.WriteString(w, "ok")
			})
			var proxied atomic.Int64
			if proxy := tg.base.Proxy; proxy != nil {
				tg.base.Proxy = func(req *http.Request) (*url.URL, error) { proxied.Add(1); return proxy(req) }
			}
			var mu sync.Mutex
			var events []string
			note := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
			wrote := make(chan struct{})
			body := &eofNoter{Reader: strings.NewReader(strings.Repeat("x", 100<<10)), note: note}
			req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
				GetConn:           func(string) { note("GetConn") },
				TLSHandshakeStart: func() { note("TLSHandshakeStart") },
				GotConn:           func(httptrace.GotConnInfo) { note("GotConn") },
				WroteRequest: func(i httptrace.WroteRequestInfo) {
					if i.Err != nil {
						t.Errorf("WroteRequest: %v", i.Err)
					}
					note("WroteRequest")
					close(wrote)
				},
			}), http.MethodPut, tg.url, body)
			resp, err := tg.base.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			note("response")
			readAll(t, resp)
			select {
			case <-wrote:
			case <-time.After(10 * time.Second):
				t.Fatal("WroteRequest was never reported")
			}
			want := []string{"GetConn", "GotConn", "body EOF", "WroteRequest"}
			if r.https {
				want = []string{"GetConn", "TLSHandshakeStart", "GotConn", "body EOF", "WroteRequest"}
			}
			mu.Lock()
			defer mu.Unlock()
			var phases []string
			gotConn, response := -1, -1
			for i, e := range events {
				switch e {
				case "response":
					response = i
					continue
				case "GotConn":
					gotConn = i
				}
				phases = append(phases, e)
			}
			if strings.Join(phases, " ") != strings.Join(want, " ") {
				t.Errorf("events %v, want %v in this order (and the response after GotConn)", events, want)
			}
			if response < gotConn {
				t.Errorf("events %v: the response came before GotConn", events)
			}
			if r.proxy && proxied.Load() == 0 {
				t.Error("the transport did not ask its Proxy about the request")
			}
		})
	}
}

// eofNoter notes when its reader reaches the end.
type eofNoter struct {
	io.Reader
	note func(string)
	once sync.Once
}

func (e *eofNoter) Read(p []byte) (int, error) {
	n, err := e.Reader.Read(p)
	if err == io.EOF {
		e.once.Do(func() { e.note("body EOF") })
	}
	return n, err
}

// Cancelling the context of a request whose body was read to the end
// leaves its connection in the pool: guardhttp ends every attempt by
// cancelling its context, and a loopback benchmark would show a new
// connection per request otherwise.
func TestContractCancelAfterEOFKeepsTheConnection(t *testing.T) {
	for _, r := range routes {
		t.Run(r.name, func(t *testing.T) {
			tg := r.start(t, func(w http.ResponseWriter, req *http.Request) { _, _ = io.WriteString(w, "ok") })
			for i := range 3 {
				ctx, cancel := context.WithCancel(context.Background())
				var reused bool
				req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
					GotConn: func(info httptrace.GotConnInfo) { reused = info.Reused },
				}), http.MethodGet, tg.url, nil)
				resp, err := tg.base.RoundTrip(req)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := io.ReadAll(resp.Body); err != nil {
					t.Fatal(err)
				}
				cancel()
				resp.Body.Close()
				if i > 0 && !reused {
					t.Errorf("request %d: a new connection, want the one the last request left", i+1)
				}
			}
		})
	}
}

// RoundTrip closes the request's body, whether it succeeds or fails:
// guardhttp hands a body to the base transport and does not close it
// again.
func TestContractRoundTripClosesTheRequestBody(t *testing.T) {
	tg := routes[0].start(t, func(w http.ResponseWriter, req *http.Request) { _, _ = io.WriteString(w, "ok") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := ln.Addr().String()
	ln.Close() // nothing listens there any more: connection refused
	for _, u := range []string{tg.url, "http://" + closedAddr} {
		body := &closeCounter{Reader: strings.NewReader("x")}
		req, _ := http.NewRequest(http.MethodPut, u, body)
		resp, err := tg.base.RoundTrip(req)
		if err == nil {
			readAll(t, resp)
		}
		if got := body.closes.Load(); got != 1 {
			t.Errorf("%s (err %v): body closed %d times, want 1", u, err, got)
		}
	}
}

// http.NewRequest sets GetBody for the bodies it knows how to rewind:
// guardhttp sends a request again through GetBody, and buffers only the
// others.
func TestContractNewRequestSetsGetBody(t *testing.T) {
	for _, body := range []io.Reader{bytes.NewReader([]byte("x")), bytes.NewBufferString("x"), strings.NewReader("x")} {
		req, _ := http.NewRequest(http.MethodPost, "http://example.test/", body)
		if req.GetBody == nil {
			t.Errorf("%T: no GetBody", body)
			continue
		}
		b, err := req.GetBody()
		if err != nil {
			t.Fatal(err)
		}
		if got, _ := io.ReadAll(b); string(got) != "x" {
			t.Errorf("%T: GetBody gave %q", body, got)
		}
	}
}

// The body of a 101 Switching Protocols response is the connection, an
// io.ReadWriteCloser: guardhttp leaves it to the caller untimed.
func TestContractSwitchingProtocolsBodyIsTheConnection(t *testing.T) {
	tg := routes[0].start(t, func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Connection", "Upgrade")
		w.Header().Set("Upgrade", "echo")
		w.WriteHeader(http.StatusSwitchingProtocols)
		conn, buf, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = io.Copy(conn, io.LimitReader(buf, 4))
	})
	req, _ := http.NewRequest(http.MethodGet, tg.url, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "echo")
	resp, err := tg.base.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rw, ok := resp.Body.(io.ReadWriteCloser)
	if resp.StatusCode != http.StatusSwitchingProtocols || !ok {
		t.Fatalf("status %d, body %T: want 101 and an io.ReadWriteCloser", resp.StatusCode, resp.Body)
	}
	if _, err := io.WriteString(rw, "ping"); err != nil {
		t.Fatal(err)
	}
	if got, _ := io.ReadAll(rw); string(got) != "ping" {
		t.Errorf("echo %q", got)
	}
}
