package guardhttp_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

// pipeNet is an in-memory network for synctest: each dial is a net.Pipe
// whose server end the listener accepts.
type pipeNet struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeNet() *pipeNet {
	return &pipeNet{conns: make(chan net.Conn), done: make(chan struct{})}
}

func (p *pipeNet) DialContext(ctx context.Context, _, _ string) (net.Conn, error) {
	c, s := net.Pipe()
	select {
	case p.conns <- s:
		return c, nil
	case <-p.done:
		return nil, net.ErrClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (p *pipeNet) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.done:
		return nil, net.ErrClosed
	}
}

func (p *pipeNet) Close() error   { p.once.Do(func() { close(p.done) }); return nil }
func (p *pipeNet) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

type connKey struct{}

// inBubble returns cfg with every phase timeout off: the Transport's phase
// timers are pooled across requests, and a timer made in one synctest
// bubble must not be reset outside it.
func inBubble(cfg guardhttp.Config) guardhttp.Config {
	cfg.ConnectTimeout, cfg.TLSHandshakeTimeout, cfg.WriteTimeout = -1, -1, -1
	cfg.ResponseHeaderTimeout, cfg.BodyIdleTimeout = -1, -1
	return cfg
}

// A keyed request whose first send's connection dropped mid-handler is
// retried with the same key; the retry meets the server's 409 "still in
// flight", waits for its Retry-After, and then gets the stored answer:
// the handler ran once per key and every caller got its answer.
func TestInFlightConflictRetried(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const callers = 20
		store, err := memstore.New(memstore.Config{})
		if err != nil {
			t.Fatal(err)
		}
		keys, err := idempotency.New(store, idempotency.Config{SingleTenant: true})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		runs := map[string]int{}
		conflicts := 0
		handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key := r.Header.Get("Idempotency-Key")
			mu.Lock()
			runs[key]++
			first := runs[key] == 1
			mu.Unlock()
			if first {
				// The caller's connection drops while the charge runs on.
				r.Context().Value(connKey{}).(net.Conn).Close()
			}
			time.Sleep(500 * time.Millisecond) // the slow charge
			fmt.Fprintf(w, "charged %s", key)
		})
		counting := func(next http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				cw := &codeWriter{ResponseWriter: w}
				next.ServeHTTP(cw, r)
				if cw.code == http.StatusConflict {
					mu.Lock()
					conflicts++
					mu.Unlock()
				}
			})
		}
		pn := newPipeNet()
		srv := &http.Server{
			Handler:     counting(keys.Middleware(handler)),
			ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
		}
		go srv.Serve(pn)
		base := &http.Transport{DialContext: pn.DialContext}
		rt := newTransport(t, base, inBubble(guardhttp.Config{
			Retry:   guardrail.Retry{Backoff: backoff.None(), Budget: budget.Unlimited()},
			Breaker: breaker.Config{MinRequests: 1000}, // 20 drops at once are not what is tested
		}))
		client := &http.Client{Transport: rt}

		start := time.Now()
		var wg sync.WaitGroup
		errs := make([]error, callers)
		for i := range callers {
			wg.Go(func() {
				key := fmt.Sprintf("key-%d", i)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://svc/charge", strings.NewReader(`{"amount":10}`))
				req.Header.Set("Idempotency-Key", key)
				resp, err := client.Do(req)
				if err != nil {
					errs[i] = err
					return
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK || string(body) != "charged "+key {
					errs[i] = fmt.Errorf("got %d %q", resp.StatusCode, body)
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		time.Sleep(time.Second) // let any handler still running finish (fake time)
		synctest.Wait()
		mu.Lock()
		defer mu.Unlock()
		for i, err := range errs {
			if err != nil {
				t.Errorf("caller %d: %v", i, err)
			}
		}
		for k, n := range runs {
			if n != 1 {
				t.Errorf("handler ran %d times for %s, want 1", n, k)
			}
		}
		if len(runs) != callers {
			t.Errorf("handler ran for %d keys, want %d", len(runs), callers)
		}
		if conflicts != callers {
			t.Errorf("server answered 409 %d times, want %d (one per caller)", conflicts, callers)
		}
		// The retry waited the Retry-After (1 s), not less.
		if took < time.Second {
			t.Errorf("callers done after %v, before the 1 s Retry-After", took)
		}
		rt.CloseIdleConnections()
		pn.Close()
		srv.Close()
		if c, ok := any(store).(io.Closer); ok {
			c.Close()
		}
	})
}

// A 409 to a request without an idempotency key is someone else's
// conflict: final, whatever its Retry-After.
func TestConflictWithoutKeyFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		n := 0
		pn := newPipeNet()
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			n++
			mu.Unlock()
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusConflict)
		})}
		go srv.Serve(pn)
		rt := newTransport(t, &http.Transport{DialContext: pn.DialContext}, inBubble(guardhttp.Config{
			Retry: guardrail.Retry{Budget: budget.Unlimited()},
		}))
		for _, method := range []string{http.MethodPut, http.MethodPost} {
			n = 0
			req, _ := http.NewRequest(method, "http://svc/x", strings.NewReader("x"))
			resp, err := (&http.Client{Transport: rt}).Do(req)
			if err != nil {
				t.Fatalf("%s: %v", method, err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusConflict || n != 1 {
				t.Errorf("%s: got %d after %d sends, want 409 after 1", method, resp.StatusCode, n)
			}
		}
		rt.CloseIdleConnections()
		pn.Close()
		srv.Close()
	})
}

// The in-flight retry stays inside the deadline and MaxRetryAfter: a
// Retry-After that does not fit ends the call with the 409, sent once more
// never.
func TestInFlightConflictBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		n := 0
		pn := newPipeNet()
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			n++
			mu.Unlock()
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusConflict)
		})}
		go srv.Serve(pn)
		tests := []struct {
			name    string
			retry   guardrail.Retry
			timeout time.Duration
			wantErr error
		}{
			{"deadline", guardrail.Retry{Budget: budget.Unlimited()}, 2 * time.Second, guardrail.ErrDeadline},
			{"max retry after", guardrail.Retry{Budget: budget.Unlimited(), MaxRetryAfter: time.Second}, time.Minute, nil},
		}
		for _, tt := range tests {
			n = 0
			rt := newTransport(t, &http.Transport{DialContext: pn.DialContext}, inBubble(guardhttp.Config{Retry: tt.retry}))
			ctx, cancel := context.WithTimeout(context.Background(), tt.timeout)
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://svc/x", strings.NewReader("x"))
			req.Header.Set("Idempotency-Key", "k")
			start := time.Now()
			resp, err := rt.RoundTrip(req)
			took := time.Since(start)
			cancel()
			if resp != nil {
				resp.Body.Close()
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) && (resp == nil || resp.StatusCode != http.StatusConflict) {
				t.Errorf("%s: err = %v", tt.name, err)
			}
			if n != 1 || took != 0 {
				t.Errorf("%s: %d sends, took %v; want 1 send, no wait", tt.name, n, took)
			}
			rt.CloseIdleConnections()
		}
		pn.Close()
		srv.Close()
	})
}

type codeWriter struct {
	http.ResponseWriter
	code int
}

func (w *codeWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}
