package main

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// TestErrorSummaryBursts: 101 errors in 2 s are three lines: the first at
// once, the other 100 when the interval ends, and the end of the burst an
// interval later.
func TestErrorSummaryBursts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out syncBuilder
		s := newErrorSummary(&out, "p: ", 10*time.Second)
		s.add("upstream error: GET /0: connection refused")
		if got := strings.Count(out.String(), "\n"); got != 1 || !strings.Contains(out.String(), "GET /0: connection refused") {
			t.Fatalf("after the first error: %q, want it logged at once", out.String())
		}
		for i := 1; i <= 100; i++ {
			time.Sleep(20 * time.Millisecond)
			s.add(fmt.Sprintf("upstream error: GET /%d: connection refused", i))
		}
		if got := strings.Count(out.String(), "\n"); got != 1 {
			t.Fatalf("after 101 errors in 2s: %d lines, want 1:\n%s", got, out.String())
		}
		time.Sleep(8*time.Second + time.Millisecond) // the interval ends at 10 s
		synctest.Wait()
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 2 || !strings.Contains(lines[1], "100 more error(s) in the last 10s; last: upstream error: GET /100") {
			t.Fatalf("at 10s: %q, want the count of the interval", lines)
		}
		time.Sleep(10 * time.Second) // a whole interval without error
		synctest.Wait()
		lines = strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 3 || !strings.Contains(lines[2], "errors stopped: 101 in 2s") {
			t.Fatalf("at 20s: %q, want the end of the burst", lines)
		}
		// A new burst starts with a line at once; a lone error has no end line.
		s.add("upstream error: GET /again: connection refused")
		time.Sleep(time.Minute)
		synctest.Wait()
		lines = strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 4 || !strings.Contains(lines[3], "GET /again") {
			t.Fatalf("a lone error: %q, want one line", lines)
		}
		s.Close()
	})
}

// TestErrorSummaryClose: Close writes what is pending and stops the timer.
func TestErrorSummaryClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var out syncBuilder
		s := newErrorSummary(&out, "", 10*time.Second)
		for range 5 {
			s.add("boom")
		}
		s.Close()
		s.add("after close")
		lines := strings.Split(strings.TrimSpace(out.String()), "\n")
		if len(lines) != 3 || !strings.Contains(lines[1], "4 more error(s) before shutdown") || !strings.Contains(lines[2], "errors stopped: 5") {
			t.Fatalf("%q", lines)
		}
	})
}

// TestFaultProxyUpstreamDownLogsOnce: with the upstream down, 50 requests
// through the proxy all get 502 and leave one line on stderr, not 50; the
// rest are counted when the proxy stops.
func TestFaultProxyUpstreamDownLogsOnce(t *testing.T) {
	noLeaks(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close() // nothing listens: every dial is refused

	r := start(t, runFaultProxy, "--to", down)
	for i := range 50 {
		resp, err := r.client.Get(fmt.Sprintf("%s/orders/%d", r.app, i))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway {
			t.Fatalf("status %d, want 502", resp.StatusCode)
		}
	}
	r.stop(t)
	var upstream []string
	for _, l := range r.stderr.lines() {
		if strings.Contains(l, "error") {
			upstream = append(upstream, l)
		}
	}
	if len(upstream) != 3 || !strings.Contains(upstream[0], "GET /orders/0") ||
		!strings.Contains(upstream[1], "49 more error(s)") || !strings.Contains(upstream[2], "errors stopped: 50") {
		t.Fatalf("stderr: %q, want the first error, then the count of the other 49", upstream)
	}
}

// lines returns every complete line written so far.
func (l *lines) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.all...)
}

// syncBuilder is a strings.Builder for a logger written from a timer.
type syncBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
