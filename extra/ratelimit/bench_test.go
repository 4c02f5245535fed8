package ratelimit_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/guardrail-go/guardrail/extra/ratelimit"
)

func TestAdmitDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage counters change allocation counts")
	}
	l := mustNew(t, ratelimit.Config{Rate: 1e9, Burst: 1 << 30})
	if n := testing.AllocsPerRun(1000, func() { _ = l.Allow("known") }); n != 0 {
		t.Errorf("admitting a known key: %v allocs; want 0", n)
	}
	byAddr := mustNew(t, ratelimit.Config{Rate: 1e9, Burst: 1 << 30}).Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, addr := range []string{"192.0.2.1:1234", "[2001:db8::1]:443", "[fe80::1%eth0]:80", "garbage"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = addr
		w := &discard{h: http.Header{}}
		byAddr.ServeHTTP(w, r)
		if n := testing.AllocsPerRun(1000, func() { byAddr.ServeHTTP(w, r) }); n != 0 {
			t.Errorf("admitting a known peer %q: %v allocs; want 0", addr, n)
		}
	}
	strict := mustNew(t, ratelimit.Config{Key: headerKey, Rate: 0.1, Burst: 1}) // Retry-After of at most 10 s: a shared header value
	h := strict.Middleware(http.NotFoundHandler())
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Client", "abuser")
	w := &discard{h: http.Header{}}
	h.ServeHTTP(w, r) // spends the only token
	if n := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, r) }); n != 0 {
		t.Errorf("refusing in the middleware: %v allocs; want 0", n)
	}
	if w.code != http.StatusTooManyRequests {
		t.Errorf("status %d; want 429", w.code)
	}
}

// BenchmarkAllow: the cost of the decision alone.
func BenchmarkAllow(b *testing.B) {
	b.Run("admit_one_key", func(b *testing.B) {
		l := mustNew(b, ratelimit.Config{Rate: 1e9, Burst: 1 << 30})
		b.ReportAllocs()
		for b.Loop() {
			_ = l.Allow("client-1")
		}
	})
	b.Run("admit_1000_keys", func(b *testing.B) {
		l := mustNew(b, ratelimit.Config{Rate: 1e9, Burst: 1 << 30})
		keys := make([]string, 1000)
		for i := range keys {
			keys[i] = "client-" + strconv.Itoa(i)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			_ = l.Allow(keys[i%len(keys)])
			i++
		}
	})
	b.Run("admit_parallel", func(b *testing.B) {
		l := mustNew(b, ratelimit.Config{Rate: 1e9, Burst: 1 << 30})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				_ = l.Allow("client-" + strconv.Itoa(i%64))
				i++
			}
		})
	})
	b.Run("refuse", func(b *testing.B) {
		l := mustNew(b, ratelimit.Config{Rate: 0.001, Burst: 1})
		_ = l.Allow("abuser")
		b.ReportAllocs()
		for b.Loop() {
			_ = l.Allow("abuser")
		}
	})
	b.Run("new_key_full_table_refilled", func(b *testing.B) {
		l := mustNew(b, ratelimit.Config{Rate: 1e9, Burst: 1 << 30, MaxKeys: 1000}) // full again at once, but not idle
		keys := make([]string, 1<<16)
		for i := range keys {
			keys[i] = "k" + strconv.Itoa(i)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			_ = l.Allow(keys[i%len(keys)])
			i++
		}
	})
	b.Run("new_key_full_table", func(b *testing.B) {
		l := mustNew(b, ratelimit.Config{Rate: 1, MaxKeys: 1000})
		keys := make([]string, 1<<16)
		for i := range keys {
			keys[i] = "k" + strconv.Itoa(i)
		}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			_ = l.Allow(keys[i%len(keys)])
			i++
		}
	})
}

// BenchmarkMiddleware: the middleware around an empty handler, against
// the empty handler alone.
func BenchmarkMiddleware(b *testing.B) {
	noop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	l := mustNew(b, ratelimit.Config{Key: headerKey, Rate: 1e9, Burst: 1 << 30})
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Client", "alice")
	w := httptest.NewRecorder()
	byAddr := mustNew(b, ratelimit.Config{Rate: 1e9, Burst: 1 << 30}).Middleware(noop)
	for _, tc := range []struct {
		name   string
		h      http.Handler
		remote string
	}{
		{"bare", noop, ""},
		{"limited", l.Middleware(noop), ""},
		{"by_addr_ipv4", byAddr, "192.0.2.1:1234"},
		{"by_addr_ipv6", byAddr, "[2001:db8:85a3::8a2e:370:7334]:443"},
	} {
		b.Run(tc.name, func(b *testing.B) {
			r := r.Clone(r.Context())
			if tc.remote != "" {
				r.RemoteAddr = tc.remote
			}
			b.ReportAllocs()
			for b.Loop() {
				tc.h.ServeHTTP(w, r)
			}
		})
	}
}

// discard is a ResponseWriter that keeps only the status.
type discard struct {
	h    http.Header
	code int
}

func (d *discard) Header() http.Header         { return d.h }
func (d *discard) Write(p []byte) (int, error) { return len(p), nil }
func (d *discard) WriteHeader(code int)        { d.code = code }
