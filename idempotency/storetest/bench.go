package storetest

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/idempotency"
)

// benchHandler answers like a small JSON API.
var benchHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write([]byte(`{"id":"ch_1","status":"succeeded","amount":4200}`))
})

var benchSeq atomic.Int64

// benchKey returns a key unique across benchmark runs in this process.
func benchKey(prefix string) string {
	return prefix + strconv.FormatInt(benchSeq.Add(1), 36)
}

// BenchmarkMiddleware measures one request through the middleware on s,
// next to the same request on the bare handler, so the added latency is
// the difference within one run:
//
//   - bare: the handler alone;
//   - nokey: a request without a key, passed through;
//   - first: a new key each time (lock, run, store: two store round trips);
//   - replay: the same key each time (one round trip, handler not run).
func BenchmarkMiddleware(b *testing.B, s idempotency.Store) {
	body := `{"order":"o-1","amount":4200}`
	serve := func(b *testing.B, h http.Handler, key string) {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
		if key != "" {
			req.Header.Set(idempotency.HeaderKey, key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusCreated {
			b.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	}
	mw := middleware(s, idempotency.Config{Logger: discardLogger()})(benchHandler)
	prefix := idempotency.NewToken()[:8] + "-"
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			serve(b, benchHandler, "")
		}
	})
	b.Run("nokey", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			serve(b, mw, "")
		}
	})
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			serve(b, mw, benchKey(prefix))
		}
	})
	b.Run("replay", func(b *testing.B) {
		key := benchKey(prefix)
		serve(b, mw, key)
		b.ReportAllocs()
		for b.Loop() {
			serve(b, mw, key)
		}
	})
}

// BenchmarkMiddlewareParallel is BenchmarkMiddleware under b.RunParallel:
// the throughput of the middleware on s with every core busy, next to the
// bare handler's in the same run.
func BenchmarkMiddlewareParallel(b *testing.B, s idempotency.Store) {
	body := `{"order":"o-1","amount":4200}`
	serve := func(pb *testing.PB, h http.Handler, key func() string) {
		for pb.Next() {
			req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(body))
			if k := key(); k != "" {
				req.Header.Set(idempotency.HeaderKey, k)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusCreated {
				panic("storetest: status " + strconv.Itoa(rec.Code) + ": " + rec.Body.String())
			}
		}
	}
	mw := middleware(s, idempotency.Config{Logger: discardLogger()})(benchHandler)
	prefix := idempotency.NewToken()[:8] + "-"
	b.Run("bare", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) { serve(pb, benchHandler, func() string { return "" }) })
	})
	b.Run("first", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) { serve(pb, mw, func() string { return benchKey(prefix) }) })
	})
	b.Run("replay", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			key := benchKey(prefix)
			serve(pb, mw, func() string { return key })
		})
	})
}

// BenchmarkExtend measures one lease renewal (Store.Extend on a held lock),
// the cost a slow handler pays every third of its lease, next to Begin on
// a new key (one lock, the middleware's first call) in the same run.
func BenchmarkExtend(b *testing.B, s idempotency.Store) {
	ctx := context.Background()
	prefix := idempotency.NewToken()[:8] + "-"
	fp := idempotency.Fingerprint{1}
	b.Run("begin", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Begin(ctx, benchKey(prefix), fp, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("extend", func(b *testing.B) {
		key := benchKey(prefix)
		res, err := s.Begin(ctx, key, fp, time.Minute)
		if err != nil || res.State != idempotency.StateAcquired {
			b.Fatalf("Begin: %v %v", res.State, err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if err := s.Extend(ctx, key, res.Token, time.Minute); err != nil {
				b.Fatal(err)
			}
		}
	})
}
