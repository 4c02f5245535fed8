package sim_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/cmd/guardrail/internal/sim"
)

// A retry storm without jitter: 1000 clients fail together and retry
// together, in ten waves, for 32.7 seconds.
func ExampleJitter() {
	rows, err := sim.Jitter(context.Background(), sim.JitterConfig{
		Strategies: []string{sim.StrategyNone},
	})
	if err != nil {
		panic(err)
	}
	sim.WriteTable(os.Stdout, rows)
	for _, s := range rows[0].Result.Slots[:4] {
		fmt.Printf("t=%v calls=%d retries=%d served=%d\n", s.Start, s.Calls, s.Retries, s.Served)
	}
	// Output:
	// no jitter       total_calls= 5500 retry_peak/slot= 900 gave_up=   0 all_done_at=32.7s
	// t=0s calls=1000 retries=0 served=100
	// t=100ms calls=900 retries=900 served=100
	// t=300ms calls=800 retries=800 served=100
	// t=700ms calls=700 retries=700 served=100
}

// A dead dependency, 1000 calls over 2 seconds, up to 4 attempts each: a
// 10 % retry budget holds the load to about 1.1 calls per call.
func ExampleRun() {
	for _, b := range []*budget.Config{nil, {Ratio: 0.1, Max: 10}} {
		res, err := sim.Run(context.Background(), sim.Config{
			Clients:     1000,
			MaxAttempts: 4,
			CapacityAt:  func(time.Duration) int { return 0 }, // down throughout
			Arrival:     sim.Arrival{Spread: 2 * time.Second},
			Budget:      b,
		})
		if err != nil {
			panic(err)
		}
		fmt.Printf("budget=%t calls=%d per_call=%.2f\n", b != nil, res.TotalCalls, float64(res.TotalCalls)/float64(res.Clients))
	}
	// Output:
	// budget=false calls=4000 per_call=4.00
	// budget=true calls=1109 per_call=1.11
}
