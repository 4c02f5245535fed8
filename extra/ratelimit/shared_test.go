package ratelimit_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/extra/ratelimit"
	"github.com/guardrail-go/guardrail/fleet"
)

// bucketStore is a fleet.TokenStore in memory, on the test's clock.
type bucketStore struct {
	mu sync.Mutex
	b  map[string]*[2]float64 // tokens, seconds since epoch
	t0 time.Time
}

func newBucketStore() *bucketStore {
	return &bucketStore{b: map[string]*[2]float64{}, t0: time.Now()}
}

func (s *bucketStore) refill(key string, rate float64, burst int) *[2]float64 {
	now := time.Since(s.t0).Seconds()
	b := s.b[key]
	if b == nil {
		b = &[2]float64{float64(burst), now}
		s.b[key] = b
	}
	b[0] = min(b[0]+(now-b[1])*rate, float64(burst))
	b[1] = now
	return b
}

func (s *bucketStore) Take(_ context.Context, key string, want int, rate float64, burst int) (int, time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.refill(key, rate, burst)
	got := min(want, int(math.Floor(b[0])))
	b[0] -= float64(got)
	if b[0] < 1 {
		return got, time.Duration(math.Ceil((1 - b[0]) / rate * 1e9)), nil
	}
	return got, 0, nil
}

func (s *bucketStore) Return(_ context.Context, key string, n int, rate float64, burst int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.refill(key, rate, burst)
	b[0] = min(b[0]+float64(n), float64(burst))
	return nil
}

func sharedLimiter(t *testing.T, store fleet.TokenStore, cfg ratelimit.Config) (*ratelimit.Limiter, *fleet.Limiter) {
	t.Helper()
	fl, err := fleet.NewLimiter(fleet.LimiterConfig{Store: store, Rate: 2, Burst: 4})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Shared = fl
	l, err := ratelimit.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l, fl
}

func TestSharedConfigErrors(t *testing.T) {
	fl, err := fleet.NewLimiter(fleet.LimiterConfig{Store: newBucketStore()})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	_, err = ratelimit.New(ratelimit.Config{Shared: fl, Rate: 5, Burst: 3, MaxKeys: 10})
	if !errors.Is(err, ratelimit.ErrInvalidConfig) {
		t.Fatalf("err = %v", err)
	}
	for _, f := range []string{"Rate", "Burst", "MaxKeys"} {
		if !strings.Contains(err.Error(), "ratelimit: Config."+f+" is ") {
			t.Errorf("the error does not name %s: %v", f, err)
		}
	}
}

// Two servers share one limit of 2/s in bursts of 4: a client whose
// requests alternate between them gets 4 at once in all, then 429s whose
// Retry-After is never early.
func TestSharedAcrossServers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := newBucketStore()
		ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
		var handlers []http.Handler
		for range 2 {
			l, fl := sharedLimiter(t, store, ratelimit.Config{})
			defer fl.Close()
			handlers = append(handlers, l.Middleware(ok))
		}
		send := func(i int) *httptest.ResponseRecorder {
			req := httptest.NewRequest(http.MethodGet, "/", nil)
			req.RemoteAddr = "192.0.2.7:4711"
			rec := httptest.NewRecorder()
			handlers[i%2].ServeHTTP(rec, req)
			return rec
		}
		admitted, refused := 0, 0
		var retry int
		for i := range 20 {
			switch rec := send(i); rec.Code {
			case http.StatusNoContent:
				admitted++
			case http.StatusTooManyRequests:
				refused++
				n, err := strconv.Atoi(rec.Header().Get("Retry-After"))
				if err != nil || n < 1 {
					t.Fatalf("Retry-After %q", rec.Header().Get("Retry-After"))
				}
				retry = n
			default:
				t.Fatalf("status %d", rec.Code)
			}
		}
		if admitted != 4 || refused != 16 {
			t.Fatalf("admitted %d, refused %d; want the fleet's burst of 4 admitted", admitted, refused)
		}
		time.Sleep(time.Duration(retry) * time.Second)
		for i := range 2 {
			if rec := send(i); rec.Code != http.StatusNoContent {
				t.Errorf("after Retry-After %ds, server %d answered %d", retry, i, rec.Code)
			}
		}
	})
}

func TestSharedAllowAndClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, fl := sharedLimiter(t, newBucketStore(), ratelimit.Config{})
		for range 4 {
			if err := l.Allow("k"); err != nil {
				t.Fatal(err)
			}
		}
		var le *ratelimit.LimitedError
		if err := l.Allow("k"); !errors.As(err, &le) || le.RetryAfter != time.Second {
			t.Fatalf("err = %v, want a refusal of 1s", err)
		}
		if err := fl.Close(); err != nil {
			t.Fatal(err)
		}
		rec := httptest.NewRecorder()
		l.Middleware(http.NotFoundHandler()).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/", nil))
		if rec.Code != http.StatusServiceUnavailable {
			t.Errorf("with the fleet limiter closed: %d, want 503", rec.Code)
		}
	})
}
