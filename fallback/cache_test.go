package fallback_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/fallback"
)

type price struct {
	SKU   string
	Cents int
}

// pricing is a fake pricing service; calls counts what reached it.
type pricing struct {
	mu    sync.Mutex
	down  bool
	calls int
}

func (p *pricing) get(sku string) func(context.Context) (price, error) {
	return func(context.Context) (price, error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.calls++
		if p.down {
			return price{}, errors.New("pricing: connection refused")
		}
		return price{SKU: sku, Cents: 10_000}, nil
	}
}

// During an outage the last good price is served marked stale, within its
// TTL; after the TTL, or for a SKU never seen, the answer
// is an error, never a price of 0.
func TestCacheServesLastGoodWithinTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := mustCache[string, price](t, fallback.CacheConfig{TTL: time.Minute})
		svc := &pricing{}
		ctx := context.Background()

		r, err := c.Do(ctx, "p1", svc.get("p1"))
		if err != nil || r.Stale || r.Value.Cents != 10_000 || r.Age != 0 || r.Err != nil {
			t.Fatalf("fresh: %+v, %v", r, err)
		}
		svc.down = true
		time.Sleep(30 * time.Second)
		r, err = c.Do(ctx, "p1", svc.get("p1"))
		if err != nil || !r.Stale || r.Value.Cents != 10_000 || r.Age != 30*time.Second || r.Err == nil {
			t.Errorf("outage at 30 s: %+v, %v; want the last good price, stale, 30s old, with the call's error", r, err)
		}

		r, err = c.Do(ctx, "p2", svc.get("p2"))
		if !errors.Is(err, fallback.ErrNoFallback) || r.Value.Cents != 0 || r.Stale {
			t.Errorf("never seen: %+v, %v; want ErrNoFallback and no value", r, err)
		}
		if err == nil || err.Error() != "fallback: no last-good value to serve: pricing: connection refused" {
			t.Errorf("ErrNoFallback does not carry the call's error: %v", err)
		}
		var cause interface{ Unwrap() []error }
		if !errors.As(err, &cause) || len(cause.Unwrap()) != 2 || cause.Unwrap()[1].Error() != "pricing: connection refused" {
			t.Errorf("ErrNoFallback does not wrap the call's error: %v", err)
		}

		time.Sleep(31 * time.Second) // 61 s: past the TTL
		r, err = c.Do(ctx, "p1", svc.get("p1"))
		if !errors.Is(err, fallback.ErrNoFallback) || r.Stale {
			t.Errorf("after TTL: %+v, %v; want ErrNoFallback", r, err)
		}
		if svc.calls != 4 || fallback.Len(c) != 0 {
			t.Errorf("%d calls, %d entries; want every Do to call through, the expired entry dropped", svc.calls, fallback.Len(c))
		}
	})
}

func TestCacheShouldFallback(t *testing.T) {
	notFound := errors.New("pricing: 404")
	c := mustCache[string, int](t, fallback.CacheConfig{
		ShouldFallback: func(err error) bool { return !errors.Is(err, notFound) },
	})
	c.Put("p1", 100)
	_, err := c.Do(context.Background(), "p1", func(context.Context) (int, error) { return 0, notFound })
	if err != notFound {
		t.Errorf("err = %v, want the call's 404 as is: the product is gone, its old price must not be served", err)
	}
	r, err := c.Do(context.Background(), "p1", func(context.Context) (int, error) { return 0, errors.New("timeout") })
	if err != nil || !r.Stale || r.Value != 100 {
		t.Errorf("timeout: %+v, %v; want the stale 100", r, err)
	}
}

func TestCacheIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c := mustCache[int, int](t, fallback.CacheConfig{MaxEntries: 3})
		for k := range 5 {
			c.Put(k, k)
			time.Sleep(time.Second)
		}
		c.Put(2, 20) // refreshed: now the most recent
		c.Put(5, 5)  // evicts 3, the oldest stored
		if fallback.Len(c) != 3 {
			t.Errorf("Len = %d, want 3", fallback.Len(c))
		}
		for k, want := range map[int]bool{0: false, 1: false, 2: true, 3: false, 4: true, 5: true} {
			if _, _, ok := c.Get(k); ok != want {
				t.Errorf("Get(%d) ok = %v, want %v", k, ok, want)
			}
		}
		if v, age, _ := c.Get(2); v != 20 || age != 0 {
			t.Errorf("Get(2) = %d, %v; want 20, 0", v, age)
		}
		c.Delete(2)
		if _, _, ok := c.Get(2); ok {
			t.Errorf("Get(2) after Delete: ok")
		}
	})
}

func TestCacheConcurrentUse(t *testing.T) {
	c := mustCache[int, int](t, fallback.CacheConfig{MaxEntries: 50})
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				k := (g*31 + i) % 100
				c.Do(context.Background(), k, func(context.Context) (int, error) {
					if i%3 == 0 {
						return 0, fmt.Errorf("down")
					}
					return k, nil
				})
			}
		})
	}
	wg.Wait()
	if n := fallback.Len(c); n > 50 {
		t.Errorf("Len = %d, want <= 50", n)
	}
	for k := range 100 {
		if v, _, ok := c.Get(k); ok && v != k {
			t.Errorf("Get(%d) = %d: a value crossed keys", k, v)
		}
	}
}

// NewCache refuses a negative TTL or MaxEntries, naming the field, instead
// of replacing it with the default.
func TestNewCacheRejectsInvalidConfig(t *testing.T) {
	for _, tt := range []struct {
		cfg  fallback.CacheConfig
		want string
	}{
		{fallback.CacheConfig{TTL: -time.Second}, "fallback: CacheConfig.TTL is -1s; want 0 (the default 1m0s) or more"},
		{fallback.CacheConfig{MaxEntries: -1}, "fallback: CacheConfig.MaxEntries is -1; want 0 (the default 10000) or more"},
		{fallback.CacheConfig{TTL: -time.Second, MaxEntries: -1}, "fallback: CacheConfig.TTL is -1s; want 0 (the default 1m0s) or more\n" +
			"fallback: CacheConfig.MaxEntries is -1; want 0 (the default 10000) or more"},
	} {
		c, err := fallback.NewCache[string, int](tt.cfg)
		if c != nil || !errors.Is(err, fallback.ErrInvalidConfig) || err.Error() != tt.want {
			t.Errorf("NewCache(%+v) = %v, %v; want nil and %q", tt.cfg, c, err, tt.want)
		}
	}
}
