package ratelimit_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/guardrail-go/guardrail/extra/ratelimit"
)

// FuzzKey: arbitrary header values and peer addresses, with the header
// key function and the default one, never panic, are answered 200 or 429,
// and never grow the table past MaxKeys.
func FuzzKey(f *testing.F) {
	f.Add("alice", "192.0.2.1:80")
	f.Add("", "")
	f.Add("\x00\xff\r\n", "[::1")
	f.Add(string(make([]byte, 1<<16)), "[2001:db8::1]:0")
	const maxKeys = 64
	byHeader := mustNew(f, ratelimit.Config{Key: headerKey, Rate: 1, Burst: 1, MaxKeys: maxKeys})
	byAddr := mustNew(f, ratelimit.Config{Rate: 1, Burst: 1, MaxKeys: maxKeys})
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	handlers := []http.Handler{byHeader.Middleware(ok), byAddr.Middleware(ok)}
	f.Fuzz(func(t *testing.T, header, addr string) {
		for _, h := range handlers {
			r := httptest.NewRequest("GET", "/", nil)
			r.Header["X-Client"] = []string{header}
			r.RemoteAddr = addr
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != http.StatusOK && w.Code != http.StatusTooManyRequests {
				t.Fatalf("status %d", w.Code)
			}
		}
		if n, m := ratelimit.Len(byHeader), ratelimit.Len(byAddr); n > maxKeys || m > maxKeys {
			t.Fatalf("Len = %d, %d; want at most %d", n, m, maxKeys)
		}
	})
}
