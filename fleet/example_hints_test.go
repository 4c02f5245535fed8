package fleet_test

import (
	"context"
	"fmt"
	"time"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/fleet"
)

// Two processes share hints on a bus (here a MemoryBus; across processes,
// redisbus). One is answered "Retry-After: 10" by the payments service;
// the other holds its own calls to it back without having sent one.
func ExampleHints() {
	bus := new(fleet.MemoryBus)
	applied := make(chan struct{}, 1)
	a, err := fleet.NewHints(fleet.HintsConfig{Bus: bus, Dependencies: []string{"payments"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer a.Close()
	b, err := fleet.NewHints(fleet.HintsConfig{
		Bus: bus, Dependencies: []string{"payments"},
		Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			if e.Kind == event.FleetHint && e.Reason == event.ReasonHintApplied {
				applied <- struct{}{}
			}
			return ctx
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	<-a.Subscribed()
	<-b.Subscribed()

	now := time.Now()
	a.RetryAfter("payments", 10*time.Second, now)
	<-applied

	_, paused := b.Paused("payments", now)
	fmt.Println("paused now:", paused)
	_, paused = b.Paused("payments", now.Add(11*time.Second))
	fmt.Println("paused in 11 s:", paused)
	// Output:
	// paused now: true
	// paused in 11 s: false
}
