package fallback_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/guardrail-go/guardrail/fallback"
)

// BenchmarkBaselineMapStore is the yardstick: storing a value in a map under
// a mutex, the least a last-good cache can do per call.
func BenchmarkBaselineMapStore(b *testing.B) {
	var mu sync.Mutex
	m := map[string]int{}
	b.ReportAllocs()
	for b.Loop() {
		mu.Lock()
		m["sku-1"] = 100
		mu.Unlock()
	}
}

func BenchmarkCacheDo(b *testing.B) {
	ctx := context.Background()
	c := mustCache[string, int](b, fallback.CacheConfig{})
	up := func(context.Context) (int, error) { return 100, nil }
	down := func(context.Context) (int, error) { return 0, errDown }
	c.Put("sku-1", 100)
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.Do(ctx, "sku-1", up)
		}
	})
	b.Run("stale", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			c.Do(ctx, "sku-1", down)
		}
	})
}

var errDown = errors.New("down")

func BenchmarkFanout(b *testing.B) {
	ctx := context.Background()
	part := func(context.Context) (int, error) { return 1, nil }
	b.ReportAllocs()
	for b.Loop() {
		g := fallback.NewFanout(ctx)
		fallback.Required(g, "B", 0, part)
		fallback.Optional(g, "C", 0, part)
		g.Wait()
	}
}
