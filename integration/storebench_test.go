package integration

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

// The idempotency benchmarks, on each store: what the HTTP middleware
// adds to a request, and what a lease renewal costs. Run them with
//
//	go test -run '^$' -bench 'Memstore|Redis|Postgres|Cluster' ./integration
//
// with GUARDRAIL_TEST_REDIS_ADDR and GUARDRAIL_TEST_POSTGRES_DSN set for
// the stores on a server.

func BenchmarkMemstoreMiddleware(b *testing.B) { benchMiddleware(b, bigMemstore(b)) }

func BenchmarkMemstoreMiddlewareParallel(b *testing.B) {
	benchMiddlewareParallel(b, bigMemstore(b))
}

func BenchmarkMemstoreExtend(b *testing.B) { benchExtend(b, bigMemstore(b)) }

func BenchmarkRedisMiddleware(b *testing.B) { benchMiddleware(b, newRedis(b)) }

func BenchmarkRedisExtend(b *testing.B) { benchExtend(b, newRedis(b)) }

func BenchmarkPostgresMiddleware(b *testing.B) { benchMiddleware(b, newPostgres(b)) }

func BenchmarkPostgresExtend(b *testing.B) { benchExtend(b, newPostgres(b)) }

// BenchmarkClusterWait is the cost of redisstore.Config.Replicas: one
// POST through the middleware on the cluster, not waiting and waiting for
// one replica.
func BenchmarkClusterWait(b *testing.B) {
	for _, r := range []int{0, 1} {
		b.Run("replicas="+strconv.Itoa(r), func(b *testing.B) { benchMiddleware(b, newClusterStore(b, r)) })
	}
}

// bigMemstore is a memstore whose limits no benchmark reaches.
func bigMemstore(b *testing.B) idempotency.Store {
	s, err := memstore.New(memstore.Config{MaxEntries: 1 << 24, MaxBytes: 1 << 33})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

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

// benchMiddlewareFor returns the middleware on s around benchHandler.
func benchMiddlewareFor(b *testing.B, s idempotency.Store) http.Handler {
	srv, err := idempotency.New(s, idempotency.Config{SingleTenant: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	return srv.Middleware(benchHandler)
}

// benchMiddleware measures one request through the middleware on s, next
// to the same request on the bare handler, so the added latency is the
// difference within one run:
//
//   - bare: the handler alone;
//   - nokey: a request without a key, passed through;
//   - first: a new key each time (lock, run, store: two store round trips);
//   - replay: the same key each time (one round trip, handler not run).
func benchMiddleware(b *testing.B, s idempotency.Store) {
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
	mw := benchMiddlewareFor(b, s)
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

// benchMiddlewareParallel is benchMiddleware under b.RunParallel: the
// throughput of the middleware on s with every core busy, next to the
// bare handler's in the same run.
func benchMiddlewareParallel(b *testing.B, s idempotency.Store) {
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
				panic("integration: status " + strconv.Itoa(rec.Code) + ": " + rec.Body.String())
			}
		}
	}
	mw := benchMiddlewareFor(b, s)
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

// benchExtend measures one lease renewal (Store.Extend on a held lock),
// the cost a slow handler pays every third of its lease, next to Begin on
// a new key (one lock, the middleware's first call) in the same run.
func benchExtend(b *testing.B, s idempotency.Store) {
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
