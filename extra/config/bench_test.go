package config

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// The handles add one atomic load and a pointer comparison per request
// to the middleware they follow; these compare them with the middleware
// used directly.
func BenchmarkMiddleware(b *testing.B) {
	reg, err := New("policy.yaml", []byte(testFile), Options{})
	if err != nil {
		b.Fatal(err)
	}
	dl, _ := reg.Deadline("api")
	sh, _ := reg.Shedder("api")
	ok := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{
		{"deadline/direct", dl.Current().Middleware(ok)},
		{"deadline/handle", dl.Middleware(ok)},
		{"shed/direct", sh.Current().Middleware(ok)},
		{"shed/handle", sh.Middleware(ok)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				bc.h.ServeHTTP(w, req)
			}
		})
	}
}
