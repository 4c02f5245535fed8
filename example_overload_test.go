package guardrail_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/throttle"
)

// A read whose first attempt is stuck in the dependency's slow tail: after
// 20 ms without an answer a hedge is sent, it answers, and the stuck
// attempt's context is cancelled.
func ExampleHedgeConfig() {
	p := &guardrail.Policy{
		Name:       "catalog",
		Idempotent: true, // only idempotent calls are hedged
		Retry: guardrail.Retry{
			Budget: budget.Unlimited(),
		},
		Hedge: &guardrail.HedgeConfig{Delay: 20 * time.Millisecond},
	}
	var calls atomic.Int64
	v, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, func(ctx context.Context) (string, error) {
		if calls.Add(1) == 1 {
			<-ctx.Done() // the slow tail: it would have taken seconds
			return "", ctx.Err()
		}
		return "answer of the hedge", nil
	})
	fmt.Println(v, err, calls.Load())
	// Output: answer of the hedge <nil> 2
}

// A dependency that answers every request with an overload error: after
// the first few, the throttle rejects nearly every call locally, with
// ErrThrottled, and the dependency sees only the few it lets through to
// find out whether it recovered.
func ExampleThrottler() {
	th, err := throttle.New(throttle.Config{}) // 2 minutes, K = 2
	if err != nil {
		panic(err)
	}
	draws := 0.0
	p := &guardrail.Policy{
		Name: "search",
		Retry: guardrail.Retry{
			MaxAttempts: 1,
		},
		Throttler: th,
		Breaker:   noBreaker(),                                                          // only the throttle acts here
		Rand:      func() float64 { draws += 0.37; return draws - float64(int(draws)) }, // reproducible
	}
	sent, throttled := 0, 0
	for range 100 {
		_, err := guardrail.DoHedged(context.Background(), p, guardrail.Call{}, func(context.Context) (int, error) {
			sent++
			return 0, guardrail.Overloaded(errors.New("HTTP 503"))
		})
		if errors.Is(err, guardrail.ErrThrottled) {
			throttled++
		}
	}
	fmt.Printf("sent %d, throttled %d\n", sent, throttled)
	// Output: sent 6, throttled 94
}
