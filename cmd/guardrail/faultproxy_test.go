package main

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func TestFaultProxy(t *testing.T) {
	noLeaks(t)
	var orders atomic.Int64
	var sawFault atomic.Value
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sawFault.Store(r.Header.Get("X-Fault"))
		if r.Method == "POST" {
			io.Copy(io.Discard, r.Body)
			orders.Add(1)
			w.WriteHeader(http.StatusCreated)
		}
		io.WriteString(w, "upstream "+r.URL.Path)
	}))
	defer upstream.Close()

	r := start(t, runFaultProxy, "--to", upstream.URL, "--fault", "lose_response; method=POST", "--header-faults")

	resp, body, err := r.get(t, "/orders/7")
	if err != nil || resp.StatusCode != 200 || body != "upstream /orders/7" {
		t.Fatalf("GET through the proxy: %v %q, want the upstream's answer", err, body)
	}

	// The upstream commits the order, the client loses the answer.
	_, err = r.client.Post(r.app+"/orders", "application/json", strings.NewReader(`{"sku":"a"}`))
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Errorf("POST: err = %v, want ECONNRESET", err)
	}
	if got := orders.Load(); got != 1 {
		t.Errorf("upstream committed %d orders, want exactly 1", got)
	}

	// A header fault is applied by the proxy and not forwarded.
	req, _ := http.NewRequest("GET", r.app+"/x", nil)
	req.Header.Set("X-Fault", "error; status=502")
	resp, err = r.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 502 {
		t.Errorf("X-Fault error: status %d, want 502", resp.StatusCode)
	}
	req, _ = http.NewRequest("GET", r.app+"/y", nil)
	req.Header.Set("X-Fault", "latency; delay=1ms")
	if resp, err = r.client.Do(req); err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if v := sawFault.Load(); resp.StatusCode != 200 || v != "" {
		t.Errorf("X-Fault latency: status %d, upstream saw X-Fault %q; want 200 and none", resp.StatusCode, v)
	}
}

func TestFaultProxyUsageErrors(t *testing.T) {
	for _, tt := range []struct {
		args []string
		want string
	}{
		{nil, "--to is required"},
		{[]string{"--to", "ftp://x"}, `--to "ftp://x" is not an http:// or https:// URL`},
		{[]string{"--to", "http://"}, `is not an http:// or https:// URL`},
	} {
		err := runFaultProxy(t.Context(), tt.args, io.Discard, io.Discard)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%v: err = %v, want a usage error containing %q", tt.args, err, tt.want)
		}
	}
}

// A truncate in front of a large chunked upstream sends the cut and stops
// reading the upstream, without holding its body.
func TestFaultProxyTruncateLargeUpstream(t *testing.T) {
	noLeaks(t)
	const bodySize = 256 << 20
	var wrote atomic.Int64
	done := make(chan struct{})
	chunk := []byte(strings.Repeat("0123456789abcdef", 2048))
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(done)
		for wrote.Load() < bodySize {
			n, err := w.Write(chunk)
			wrote.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	defer upstream.Close()
	r := start(t, runFaultProxy, "--to", upstream.URL, "--fault", "truncate; bytes=10")

	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	resp, body, err := r.get(t, "/big")
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the upstream is still being read")
	}
	runtime.ReadMemStats(&after)
	t.Logf("client got %d bytes; upstream wrote %d KiB of %d MiB; allocated %d KiB",
		len(body), wrote.Load()>>10, bodySize>>20, (after.TotalAlloc-before.TotalAlloc)>>10)
	if resp == nil || !errors.Is(err, io.ErrUnexpectedEOF) || body != "0123456789" {
		t.Errorf("got %q, %v; want the first 10 bytes and io.ErrUnexpectedEOF", body, err)
	}
	if w := wrote.Load(); w > 32<<20 {
		t.Errorf("upstream wrote %d MiB of %d MiB", w>>20, bodySize>>20)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 32<<20 {
		t.Errorf("allocated %d MiB to send 10 bytes", d>>20)
	}
}
