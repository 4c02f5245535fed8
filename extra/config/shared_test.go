package config

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// fleetStore is a fleet.TokenStore of buckets that never refill within a
// test: the processes that share it share their tokens.
type fleetStore struct {
	mu     sync.Mutex
	tokens map[string]int
	takes  int
}

func (s *fleetStore) Take(_ context.Context, key string, want int, _ float64, burst int) (int, time.Duration, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.takes++
	if s.tokens == nil {
		s.tokens = map[string]int{}
	}
	left, ok := s.tokens[key]
	if !ok {
		left = burst
	}
	got := min(want, left)
	s.tokens[key] = left - got
	if got == 0 {
		return 0, time.Hour, nil
	}
	return got, 0, nil
}

func (s *fleetStore) Return(_ context.Context, key string, n int, _ float64, burst int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens[key] = min(s.tokens[key]+n, burst)
	return nil
}

// A rate_limit section with shared: two registries (two processes) that
// share a store share one limit per client.
func TestSharedRateLimitFromFile(t *testing.T) {
	file := strings.Replace(testFile, "    shed: {limit: 100}\n",
		"    shed: {limit: 100}\n    rate_limit: {rate: 0.001, burst: 4, shared: {on_store_failure: closed, members: 2}}\n", 1)
	store := &fleetStore{}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	byHeader := func(r *http.Request) (string, error) { return r.Header.Get("X-Client"), nil }
	var handlers []http.Handler
	for range 2 {
		reg, err := New("policy.yaml", []byte(file), Options{Logger: quiet, TokenStore: store})
		if err != nil {
			t.Fatal(err)
		}
		rl, err := reg.RateLimiter("api", byHeader)
		if err != nil {
			t.Fatal(err)
		}
		handlers = append(handlers, rl.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
		t.Cleanup(func() { _ = reg.Close() })
	}
	admitted := 0
	for i := range 10 {
		req := httptest.NewRequest("GET", "/", nil)
		req.Header.Set("X-Client", "a")
		w := httptest.NewRecorder()
		handlers[i%2].ServeHTTP(w, req)
		switch w.Code {
		case http.StatusOK:
			admitted++
		case http.StatusTooManyRequests:
			if ra := w.Header().Get("Retry-After"); ra == "" || ra == "0" {
				t.Errorf("a 429 with Retry-After %q; want a positive one", ra)
			}
		default:
			t.Errorf("request %d: %d", i, w.Code)
		}
	}
	if admitted != 4 {
		t.Errorf("%d of 10 admitted across the two processes; want the shared burst, 4", admitted)
	}

	// Without a store, the section cannot be built.
	reg, err := New("policy.yaml", []byte(file), Options{Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := reg.RateLimiter("api", byHeader); err == nil || !strings.Contains(err.Error(), "Options.TokenStore") {
		t.Errorf("RateLimiter without a TokenStore: %v; want an error naming Options.TokenStore", err)
	}

	// Bad values are named by key.
	for _, tc := range []struct{ from, to, want string }{
		{"on_store_failure: closed", "on_store_failure: maybe", `servers.api.rate_limit.shared.on_store_failure: is "maybe"; want open or closed`},
		{"members: 2", "members: 2, lease: -1s", "servers.api.rate_limit.shared.lease: is -1s"},
	} {
		_, err := parse("policy.yaml", []byte(strings.Replace(file, tc.from, tc.to, 1)))
		var perr *Error
		if !errors.As(err, &perr) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an error containing %q", tc.to, err, tc.want)
		}
	}
}
