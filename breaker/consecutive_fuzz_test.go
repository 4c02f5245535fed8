package breaker_test

import (
	"testing"

	"github.com/guardrail-go/guardrail/breaker"
)

// FuzzConsecutiveFailures checks the run against a model: any sequence of
// successes, failures, ignored calls and resets, on either window, trips
// the breaker exactly when the model's run reaches the threshold.
func FuzzConsecutiveFailures(f *testing.F) {
	f.Add(uint8(3), false, []byte{1, 1, 0, 1, 1, 2, 1})
	f.Add(uint8(1), true, []byte{1, 3, 0, 1})
	f.Fuzz(func(t *testing.T, n uint8, count bool, ops []byte) {
		threshold := int(n%10) + 1
		cfg := breaker.Config{ConsecutiveFailures: threshold, MinRequests: 1 << 20, OpenJitter: -1}
		if count {
			cfg.CountWindow, cfg.MinRequests = 1<<20, 1<<20
		}
		b := mustNew(cfg)
		run := 0
		for i, op := range ops {
			switch op % 4 {
			case 0:
				calls(b, breaker.Success, 1)
				run = 0
			case 1:
				calls(b, breaker.Failure, 1)
				run++
			case 2:
				calls(b, breaker.Ignored, 1)
			case 3:
				b.Reset()
				run = 0
			}
			want := breaker.Closed
			if run >= threshold {
				want = breaker.Open
			}
			if got := b.State(); got != want {
				t.Fatalf("op %d (%v): state %v; want %v (run %d of %d)", i, ops[:i+1], got, want, run, threshold)
			}
			if want == breaker.Open {
				b.Reset()
				run = 0
			} else if m := b.Metrics(); m.ConsecutiveFailures != run {
				t.Fatalf("op %d: Metrics.ConsecutiveFailures = %d; want %d", i, m.ConsecutiveFailures, run)
			}
		}
	})
}
