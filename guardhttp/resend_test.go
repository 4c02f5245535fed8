package guardhttp_test

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// dropServer is a raw HTTP/1.1 server on loopback that answers every
// request with 200, keeping the connection open, except the one whose
// number (1-based, over all connections) is drop: it reads that request
// whole and closes the connection without a byte of answer, as a server
// that timed out an idle keep-alive connection does.
type dropServer struct {
	ln   net.Listener
	drop int64
	seen atomic.Int64
	wg   sync.WaitGroup
	mu   sync.Mutex
	conn []net.Conn
}

func newDropServer(t *testing.T, drop int64) *dropServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &dropServer{ln: ln, drop: drop}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conn = append(s.conn, c)
			s.mu.Unlock()
			s.wg.Add(1)
			go s.serve(c)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.mu.Lock()
		for _, c := range s.conn {
			c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

func (s *dropServer) url() string { return "http://" + s.ln.Addr().String() + "/" }

func (s *dropServer) serve(c net.Conn) {
	defer s.wg.Done()
	defer c.Close()
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		if s.seen.Add(1) == s.drop {
			return
		}
		if _, err := io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"); err != nil {
			return
		}
	}
}

// Every request that reaches the wire is an attempt: net/http's own
// resend of an idempotent request, after a reused connection closed
// without an answer, is counted, reported and charged to the budget, and
// a request with a body is never resent behind the engine's back.
func TestResendsAreAttempts(t *testing.T) {
	tests := []struct {
		name        string
		method      string
		body        string // "" for none
		key         bool
		maxAttempts int
		// what the server saw of the measured request, which is what
		// guardrail must count as attempts
		wantSeen int
		wantOK   bool
	}{
		// net/http resends a GET by itself: it cannot be stopped through
		// anything net/http documents, so it is counted.
		{"GET/1", http.MethodGet, "", false, 1, 2, true},
		{"GET/3", http.MethodGet, "", false, 3, 2, true},
		{"keyed bodyless POST/1", http.MethodPost, "", true, 1, 2, true},
		// A body: net/http gets no GetBody, so it leaves the retry to the
		// engine, which MaxAttempts bounds.
		{"keyed POST/1", http.MethodPost, `{"amount":10}`, true, 1, 1, false},
		{"keyed POST/3", http.MethodPost, `{"amount":10}`, true, 3, 2, true},
		{"GET with body/1", http.MethodGet, "q", false, 1, 1, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := newDropServer(t, 2) // the first request on a reused connection
			b, err := budget.New(budget.Config{})
			if err != nil {
				t.Fatal(err)
			}
			rec := &recorder{}
			c := newClient(t, guardhttp.Config{
				Retry:    guardrail.Retry{MaxAttempts: tt.maxAttempts, Backoff: backoff.None(), Budget: b},
				Observer: rec,
			})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			// Warm up: one answered request leaves a connection to reuse.
			resp, err := get(t, ctx, c, srv.url())
			if err != nil {
				t.Fatalf("warm-up: %v", err)
			}
			readAll(t, resp)
			before, tokens := rec.count(event.AttemptStart, nil), b.Tokens()
			ended := rec.count(event.AttemptEnd, nil)

			var body io.Reader
			if tt.body != "" {
				body = strings.NewReader(tt.body) // NewRequest gives it a GetBody
			}
			req, err := http.NewRequestWithContext(ctx, tt.method, srv.url(), body)
			if err != nil {
				t.Fatal(err)
			}
			if tt.key {
				req.Header.Set("Idempotency-Key", "k-1")
			}
			resp, err = c.Do(req)
			if err == nil {
				readAll(t, resp)
			}
			if got := err == nil; got != tt.wantOK {
				t.Fatalf("request succeeded: %v, want %v (err %v)", got, tt.wantOK, err)
			}
			seen := int(srv.seen.Load()) - 1
			starts := rec.count(event.AttemptStart, nil) - before
			ends := rec.count(event.AttemptEnd, nil) - ended
			charged := tokens - b.Tokens()
			if seen != tt.wantSeen {
				t.Errorf("server saw %d requests, want %d", seen, tt.wantSeen)
			}
			if starts != seen || ends != seen {
				t.Errorf("attempts started %d, ended %d; the server saw %d", starts, ends, seen)
			}
			if want := float64(seen - 1); charged < want-0.01 || charged > want+0.01 {
				t.Errorf("budget charged %.2f tokens, want %.0f", charged, want)
			}
			if tt.body != "" && seen > tt.maxAttempts {
				t.Errorf("server saw %d requests with a body, MaxAttempts is %d", seen, tt.maxAttempts)
			}
			if !tt.wantOK && tt.key && !errors.Is(err, guardrail.ErrOutcomeUnknown) {
				t.Errorf("err = %v; want ErrOutcomeUnknown for a keyed POST whose answer was lost", err)
			}
		})
	}
}
