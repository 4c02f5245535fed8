package fallback_test

import (
	"testing"

	"github.com/guardrail-go/guardrail/fallback"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// mustCache returns fallback.NewCache(c), failing the test on an error.
func mustCache[K comparable, V any](tb testing.TB, c fallback.CacheConfig) *fallback.Cache[K, V] {
	tb.Helper()
	cache, err := fallback.NewCache[K, V](c)
	if err != nil {
		tb.Fatal(err)
	}
	return cache
}
