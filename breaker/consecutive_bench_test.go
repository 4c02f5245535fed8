package breaker_test

import (
	"testing"

	"github.com/guardrail-go/guardrail/breaker"
)

// BenchmarkClosedSuccessConsecutive is BenchmarkClosedSuccess with
// ConsecutiveFailures set: a success with no run to end adds one atomic
// load.
func BenchmarkClosedSuccessConsecutive(b *testing.B) {
	for _, tc := range []struct {
		name string
		cfg  breaker.Config
	}{
		{"time", breaker.Config{ConsecutiveFailures: 5}},
		{"count", breaker.Config{CountWindow: 100, ConsecutiveFailures: 5}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			br := mustNew(tc.cfg)
			b.ReportAllocs()
			for b.Loop() {
				allowDone(br, 0)
			}
		})
		b.Run(tc.name+"_parallel", func(b *testing.B) {
			br := mustNew(tc.cfg)
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					allowDone(br, 0)
				}
			})
		})
	}
}

func TestConsecutiveSuccessDoesNotAllocate(t *testing.T) {
	if testing.CoverMode() != "" {
		t.Skip("coverage counters change allocation counts")
	}
	br := mustNew(breaker.Config{ConsecutiveFailures: 1000, MinRequests: 1 << 30})
	if n := testing.AllocsPerRun(1000, func() {
		p, _ := br.Allow()
		p.Done(breaker.Failure, 0)
		allowDone(br, 0)
	}); n != 0 {
		t.Errorf("failure then success: %v allocs; want 0", n)
	}
}
