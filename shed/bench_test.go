package shed_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/deadline"
	"github.com/guardrail-go/guardrail/shed"
)

// BenchmarkBaselineMutex is the yardstick for the others: one uncontended
// mutex round trip and a counter, the least any shared admission decision
// costs.
func BenchmarkBaselineMutex(b *testing.B) {
	var mu sync.Mutex
	n := 0
	b.ReportAllocs()
	for b.Loop() {
		mu.Lock()
		n++
		mu.Unlock()
	}
	_ = n
}

// BenchmarkBaselineTimeNow is the price of reading the clock, which the
// adaptive limit does twice per request (admission and release).
func BenchmarkBaselineTimeNow(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = time.Now()
	}
}

func BenchmarkAcquire(b *testing.B) {
	ctx := context.Background()
	b.Run("admit-release/fixed", func(b *testing.B) {
		s := mustNew(b, shed.Config{Limit: 100})
		b.ReportAllocs()
		for b.Loop() {
			tok, err := s.Acquire(ctx, shed.Normal)
			if err != nil {
				b.Fatal(err)
			}
			tok.Release()
		}
	})
	b.Run("admit-release/adaptive", func(b *testing.B) {
		s := mustNew(b, shed.Config{})
		b.ReportAllocs()
		for b.Loop() {
			tok, err := s.Acquire(ctx, shed.Normal)
			if err != nil {
				b.Fatal(err)
			}
			tok.Release()
		}
	})
	b.Run("reject", func(b *testing.B) {
		s := mustNew(b, shed.Config{Limit: 1})
		tok, _ := s.Acquire(ctx, shed.Critical)
		defer tok.Release()
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Acquire(ctx, shed.Normal); err == nil {
				b.Fatal("admitted")
			}
		}
	})
	b.Run("admit-release/parallel", func(b *testing.B) {
		s := mustNew(b, shed.Config{Limit: 1 << 20})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				tok, err := s.Acquire(ctx, shed.Normal)
				if err != nil {
					b.Fatal(err)
				}
				tok.Release()
			}
		})
	})
}

// nopWriter is the least a ResponseWriter can be, so that the benchmark
// shows the middleware's own cost.
type nopWriter struct {
	h    http.Header
	code int
}

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *nopWriter) WriteHeader(code int)        { w.code = code }

func BenchmarkMiddleware(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set(shed.HeaderPriority, "low")
	req.Header.Set(deadline.HeaderRetryAttempt, "1")
	run := func(b *testing.B, h http.Handler, want int) {
		w := &nopWriter{h: make(http.Header)}
		b.ReportAllocs()
		for b.Loop() {
			clear(w.h)
			h.ServeHTTP(w, req)
		}
		if w.code != want {
			b.Fatalf("status %d, want %d", w.code, want)
		}
	}
	b.Run("baseline-handler", func(b *testing.B) {
		run(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(http.StatusServiceUnavailable)
		}), http.StatusServiceUnavailable)
	})
	b.Run("admit", func(b *testing.B) {
		run(b, mustNew(b, shed.Config{Limit: 100}).Middleware(ok), 0)
	})
	b.Run("reject", func(b *testing.B) {
		s := mustNew(b, shed.Config{Limit: 1})
		tok, _ := s.Acquire(context.Background(), shed.Critical)
		defer tok.Release()
		run(b, s.Middleware(ok), http.StatusServiceUnavailable)
	})
}
