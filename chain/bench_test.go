package chain_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/chain"
)

// nopWriter is a ResponseWriter that keeps nothing, so the benchmark
// measures the middleware, not a recorder.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopWriter) WriteHeader(int)             {}

// BenchmarkMiddleware is the chain's cost per request: on an answer that
// succeeds, and on a refusal at the door (the failure path, which writes a
// marker).
func BenchmarkMiddleware(b *testing.B) {
	cs, _ := chain.New(chain.Config{})
	for _, tc := range []struct {
		name string
		h    http.HandlerFunc
	}{
		{"ok", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) }},
		{"refused", func(w http.ResponseWriter, r *http.Request) {
			chain.MarkNotProcessed(r.Context())
			w.WriteHeader(http.StatusServiceUnavailable)
		}},
	} {
		for _, amp := range []string{"", "3"} {
			b.Run(tc.name+"/amplification="+amp, func(b *testing.B) {
				h := cs.Middleware(tc.h)
				r := httptest.NewRequest(http.MethodGet, "/", nil)
				if amp != "" {
					r.Header.Set(chain.HeaderAmplification, amp)
				}
				w := &nopWriter{h: http.Header{}}
				b.ReportAllocs()
				for b.Loop() {
					clear(w.h)
					h.ServeHTTP(w, r)
				}
			})
		}
	}
}

// BenchmarkLevelsNote is the cost a client pays on every answer once a
// dependency has reported an admission level: the same level again, and
// a dependency without one.
func BenchmarkLevelsNote(b *testing.B) {
	var l chain.Levels
	now := time.Now()
	l.Note("a", "40", true, now)
	b.Run("same", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l.Note("a", "40", true, now)
		}
	})
	b.Run("none", func(b *testing.B) {
		var fresh chain.Levels
		b.ReportAllocs()
		for b.Loop() {
			fresh.Note("a", "", false, now)
		}
	})
}
