package fault

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/fault/faulttest"
)

// roundTripFunc is a fake transport.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// fakeBase answers every request with body, counting the calls.
func fakeBase(body string, calls *atomic.Int64) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		calls.Add(1)
		return &http.Response{StatusCode: 200, Status: "200 OK", Header: http.Header{},
			Body: io.NopCloser(strings.NewReader(body)), ContentLength: int64(len(body)), Request: r}, nil
	})
}

func newTransport(t *testing.T, cfg Config, base http.RoundTripper) (*Injector, *http.Client) {
	t.Helper()
	if cfg.Rand == nil {
		cfg.Rand = NewRand(1)
	}
	in, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	return in, &http.Client{Transport: in.Transport(base)}
}

// counting is a real loopback server counting its handler's runs.
func counting(t *testing.T, calls *atomic.Int64) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		calls.Add(1)
		io.WriteString(w, "0123456789")
	}))
	t.Cleanup(srv.Close)
	return srv
}

func realTransport(t *testing.T) http.RoundTripper {
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

func TestClientRefuseLooksLikeDeadServer(t *testing.T) {
	dead, err := faulttest.NewDeadServer()
	if err != nil {
		t.Fatal(err)
	}
	defer dead.Close()
	_, realErr := (&http.Client{Transport: realTransport(t)}).Get(dead.URL)
	if !errors.Is(realErr, syscall.ECONNREFUSED) {
		t.Fatalf("dead server: err = %v, want ECONNREFUSED", realErr)
	}

	var calls atomic.Int64
	srv := counting(t, &calls)
	_, client := newTransport(t, always(Refuse{}), realTransport(t))
	_, err = client.Get(srv.URL)
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("injected: err = %v, want ECONNREFUSED", err)
	}
	if isTimeout(err) {
		t.Errorf("err = %v is a timeout", err)
	}
	if got := calls.Load(); got != 0 {
		t.Errorf("server saw %d requests, want 0", got)
	}
	t.Logf("real: %v\ninjected: %v", realErr, err)
}

func TestClientReset(t *testing.T) {
	var calls atomic.Int64
	srv := counting(t, &calls)
	_, client := newTransport(t, always(Reset{}), realTransport(t))
	_, err := client.Get(srv.URL)
	if !errors.Is(err, syscall.ECONNRESET) || isTimeout(err) {
		t.Fatalf("err = %v, want ECONNRESET and not a timeout", err)
	}
	if got := calls.Load(); got != 0 {
		t.Errorf("server saw %d requests, want 0", got)
	}
}

func TestClientStatus(t *testing.T) {
	var calls atomic.Int64
	srv := counting(t, &calls)
	_, client := newTransport(t, always(Status{Code: 429, RetryAfter: 3 * time.Second}), realTransport(t))
	resp, err := client.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 429 || resp.Status != "429 Too Many Requests" {
		t.Errorf("status = %d %q, want 429", resp.StatusCode, resp.Status)
	}
	if got := resp.Header.Get("Retry-After"); got != "3" {
		t.Errorf("Retry-After = %q, want 3", got)
	}
	if string(body) != "Too Many Requests\n" {
		t.Errorf("body = %q", body)
	}
	if got := calls.Load(); got != 0 {
		t.Errorf("server saw %d requests, want 0", got)
	}
}

func TestClientLoseResponse(t *testing.T) {
	var calls atomic.Int64
	srv := counting(t, &calls)
	_, client := newTransport(t, always(LoseResponse{}), realTransport(t))
	_, err := client.Post(srv.URL, "text/plain", strings.NewReader("pay 10"))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("err = %v, want ECONNRESET", err)
	}
	if got := calls.Load(); got != 1 {
		t.Errorf("server committed %d times, want exactly 1", got)
	}
}

func TestClientTruncate(t *testing.T) {
	var calls atomic.Int64
	for _, tt := range []struct {
		name   string
		base   http.RoundTripper
		fault  Truncate
		want   string
		wantCL int64
	}{
		{"known length", fakeBase("0123456789", &calls), Truncate{}, "01234", 10},
		{"unknown length", roundTripFunc(func(r *http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader("0123456789")),
				ContentLength: -1, Request: r}, nil
		}), Truncate{Bytes: 3}, "012", 10},
		{"real server", realTransport(t), Truncate{Bytes: 4}, "0123", 10},
		{"unknown length past the window", unknownLength(strings.Repeat("y", truncWindow+5)),
			Truncate{Bytes: 3}, "yyy", -1},
		{"unknown length past the window, half", unknownLength(strings.Repeat("y", 3*truncWindow)),
			Truncate{}, strings.Repeat("y", truncWindow/2), -1},
		{"unknown length past the window, bytes past the end", unknownLength(strings.Repeat("y", truncWindow+5)),
			Truncate{Bytes: 1 << 20}, strings.Repeat("y", truncWindow+4), -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := counting(t, &calls)
			_, client := newTransport(t, always(tt.fault), tt.base)
			resp, err := client.Get(srv.URL)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("err = %v, want io.ErrUnexpectedEOF", err)
			}
			if string(got) != tt.want || resp.ContentLength != tt.wantCL {
				t.Errorf("got %d bytes %.20q of %d, want %d bytes %.20q of %d",
					len(got), got, resp.ContentLength, len(tt.want), tt.want, tt.wantCL)
			}
		})
	}
}

func unknownLength(body string) http.RoundTripper {
	return roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(body)),
			ContentLength: -1, Request: r}, nil
	})
}

// generated is a body of unknown length, size bytes long, made as it is
// read; it counts what was read of it.
type generated struct {
	size   int64
	read   atomic.Int64
	closed atomic.Bool
}

func (e *generated) Read(p []byte) (int, error) {
	left := e.size - e.read.Load()
	if left <= 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), left)]
	for i := range p {
		p[i] = "0123456789"[i%10]
	}
	e.read.Add(int64(len(p)))
	return len(p), nil
}

func (e *generated) Close() error { e.closed.Store(true); return nil }

// A truncated body of unknown length is cut as it streams: memory and what
// is read from the dependency stay far below the body's size.
func TestClientTruncateLargeBody(t *testing.T) {
	src := &generated{size: 256 << 20}
	_, client := newTransport(t, always(Truncate{Bytes: 10}), roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 200, Body: src, ContentLength: -1, Request: r}, nil
	}))
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, err := client.Get("http://dep.test/")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	runtime.ReadMemStats(&after)
	t.Logf("read %d bytes; %d KiB read from the dependency; allocated %d KiB",
		len(got), src.read.Load()>>10, (after.TotalAlloc-before.TotalAlloc)>>10)
	if !errors.Is(err, io.ErrUnexpectedEOF) || string(got) != "0123456789" {
		t.Errorf("got %q, %v; want 0123456789, io.ErrUnexpectedEOF", got, err)
	}
	if r := src.read.Load(); r > 1<<20 {
		t.Errorf("read %d KiB of the dependency's body to send 10 bytes", r>>10)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 4<<20 {
		t.Errorf("allocated %d KiB to send 10 bytes", d>>10)
	}
	if !src.closed.Load() {
		t.Error("the dependency's body was not closed")
	}
}

// The timing faults run in a synctest bubble against a fake base transport,
// so their durations are exact.

func TestClientLatencyExact(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		_, client := newTransport(t, always(Latency{Delay: 250 * time.Millisecond}), fakeBase("ok", &calls))
		start := time.Now()
		resp, err := client.Get("http://dep.test/")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if got, want := time.Since(start), 250*time.Millisecond; got != want {
			t.Errorf("took %v, want %v", got, want)
		}
		if calls.Load() != 1 {
			t.Errorf("base saw %d requests, want 1", calls.Load())
		}
	})
}

func TestClientLatencyCutByContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		_, client := newTransport(t, always(Latency{Delay: time.Hour}), fakeBase("ok", &calls))
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://dep.test/", nil)
		start := time.Now()
		_, err := client.Do(req)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want the deadline", err)
		}
		if got := time.Since(start); got != 2*time.Second {
			t.Errorf("gave up after %v, want 2s", got)
		}
		if calls.Load() != 0 {
			t.Errorf("base saw %d requests, want 0", calls.Load())
		}
	})
}

func TestClientHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		_, client := newTransport(t, always(Hang{}), fakeBase("ok", &calls))
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://dep.test/", nil)
		start := time.Now()
		_, err := client.Do(req)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want the deadline", err)
		}
		if got := time.Since(start); got != 3*time.Second {
			t.Errorf("hung for %v, want 3s", got)
		}
	})
}

func TestClientHangReleasedByClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		in, client := newTransport(t, always(Hang{}), fakeBase("ok", &calls))
		errc := make(chan error)
		go func() {
			_, err := client.Get("http://dep.test/")
			errc <- err
		}()
		synctest.Wait()
		in.Close()
		if err := <-errc; !errors.Is(err, ErrClosed) {
			t.Errorf("err = %v, want ErrClosed", err)
		}
	})
}

func TestClientSlowBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		_, client := newTransport(t, always(SlowBody{Bytes: 3, Every: time.Second}), fakeBase("0123456789", &calls))
		start := time.Now()
		resp, err := client.Get("http://dep.test/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if d := time.Since(start); d != 0 {
			t.Errorf("headers took %v, want at once", d)
		}
		got, err := io.ReadAll(resp.Body)
		if err != nil || string(got) != "0123456789" {
			t.Fatalf("body %q, err %v", got, err)
		}
		// 4 pieces of at most 3 bytes, plus the wait before reading EOF.
		if got, want := time.Since(start), 5*time.Second; got != want {
			t.Errorf("body took %v, want %v", got, want)
		}
	})
}

func TestClientStallBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		_, client := newTransport(t, always(StallBody{Bytes: 4}), fakeBase("0123456789", &calls))
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://dep.test/", nil)
		start := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		got, err := io.ReadAll(resp.Body)
		if string(got) != "0123" || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got %q, %v; want \"0123\" then the deadline", got, err)
		}
		if d := time.Since(start); d != 5*time.Second {
			t.Errorf("stalled for %v, want 5s", d)
		}
	})
}

func TestClientStallBodyReleasedByClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var calls atomic.Int64
		_, client := newTransport(t, always(StallBody{}), fakeBase("0123456789", &calls))
		resp, err := client.Get("http://dep.test/")
		if err != nil {
			t.Fatal(err)
		}
		errc := make(chan error)
		go func() {
			_, err := resp.Body.Read(make([]byte, 10))
			errc <- err
		}()
		synctest.Wait()
		resp.Body.Close()
		if err := <-errc; err == nil {
			t.Error("Read after Close returned no error")
		}
	})
}

func TestClientDoesNotModifyRequest(t *testing.T) {
	var sawHeader atomic.Value
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sawHeader.Store(r.Header.Get("X-Fault"))
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	})
	_, client := newTransport(t, Config{HeaderFaults: true}, base)
	req, _ := http.NewRequest("GET", "http://dep.test/", nil)
	req.Header.Set("X-Fault", "latency; delay=1ns")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if got := req.Header.Get("X-Fault"); got != "latency; delay=1ns" {
		t.Errorf("caller's request header changed to %q", got)
	}
	if got := sawHeader.Load(); got != "" {
		t.Errorf("base saw X-Fault %q, want it stripped", got)
	}
}

func TestClientNilBaseIsDefaultTransport(t *testing.T) {
	in, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	if got := in.Transport(nil).(*transport).base; got != http.DefaultTransport {
		t.Errorf("base = %v, want http.DefaultTransport", got)
	}
}
