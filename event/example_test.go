package event_test

import (
	"context"
	"fmt"

	"github.com/guardrail-go/guardrail/event"
)

// An Observer turns events into metrics, traces or logs. This one counts
// call outcomes by dependency and operation; Join feeds it and a second
// observer the same events.
func Example() {
	counts := map[string]int{}
	metrics := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.CallEnd {
			counts[e.Dependency+" "+event.Operation(ctx)+" "+e.Outcome]++
		}
		return ctx
	})
	var kinds []string
	trace := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		kinds = append(kinds, e.Kind.String())
		return ctx
	})
	obs := event.Join(metrics, nil, trace) // a nil Observer is skipped

	ctx := event.WithOperation(context.Background(), "GET /prices/{sku}")
	ctx = obs.Observe(ctx, event.Event{Kind: event.CallStart, Dependency: "pricing"})
	obs.Observe(ctx, event.Event{Kind: event.CallEnd, Dependency: "pricing", Outcome: event.OutcomeOK})
	obs.Observe(ctx, event.Event{Kind: event.CallEnd, Dependency: "pricing", Outcome: event.OutcomeCircuitOpen})

	fmt.Println(kinds)
	fmt.Println(counts["pricing GET /prices/{sku} ok"], counts["pricing GET /prices/{sku} circuit_open"])
	fmt.Println(event.Join(nil, nil) == nil)
	// Output:
	// [call_start call_end call_end]
	// 1 1
	// true
}
