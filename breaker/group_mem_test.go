package breaker_test

import (
	"runtime"
	"strconv"
	"testing"

	"github.com/guardrail-go/guardrail/breaker"
)

// An idle key costs at most 512 bytes in a Group with the default
// configuration: a group bounded to 100k keys stays within ~50 MB. The keys'
// own bytes are the caller's and are allocated before the measurement.
func TestGroupMemoryPerKey(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates tens of megabytes")
	}
	const n = 50000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = "host-" + strconv.Itoa(i) + ".example.com"
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	g := mustGroup(breaker.GroupConfig{MaxKeys: n})
	for _, k := range keys {
		g.Get(k)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	runtime.KeepAlive(g)
	t.Logf("%.0f bytes per idle key (%d keys)", per, breaker.GroupLen(g))
	if per > 512 {
		t.Fatalf("%.0f bytes per idle key, want at most 512", per)
	}
}
