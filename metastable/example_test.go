package metastable_test

import (
	"context"
	"fmt"
	"time"

	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/metastable"
	"github.com/guardrail-go/guardrail/shed"
)

// A detector on the calls to "db", with its actuator on: after the
// database is back, goodput stays at a tenth while every call makes three
// attempts; three such windows make it metastable, and the actuator
// empties the retry budget and halves the shedder's limit until goodput
// is back.
func Example() {
	b, _ := budget.New(budget.Config{})
	s, _ := shed.New(shed.Config{Name: "api", Limit: 100})
	logged := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		fmt.Printf("%s: %s -> %s", e.Dependency, e.From, e.To)
		if e.Reason != "" {
			fmt.Printf(" (%s)", e.Reason)
		}
		fmt.Println()
		return ctx
	})
	d, err := metastable.New(metastable.Config{Name: "db", Observer: logged, Relief: metastable.Relief{
		Act: true, Budgets: []*budget.Budget{b}, Shedders: []*shed.Shedder{s},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	// In a service: Policy{Name: "db", Observer: event.Join(metrics, d)}
	// and go d.Run(ctx). Here the events are sent by hand.
	ctx := context.Background()
	window := func(calls, ok, attempts int) {
		for i := range calls {
			for a := range attempts {
				d.Observe(ctx, event.Event{Kind: event.AttemptStart, Dependency: "db"})
				if a > 0 {
					d.Observe(ctx, event.Event{Kind: event.Retry, Dependency: "db"})
				}
			}
			outcome := event.OutcomeError
			if i < ok {
				outcome = event.OutcomeOK
			}
			d.Observe(ctx, event.Event{Kind: event.CallEnd, Dependency: "db", Outcome: outcome})
		}
		d.EvaluateAt(ctx, time.Now())
	}
	for range 3 {
		window(100, 10, 3)
	}
	fmt.Printf("budget %v tokens, shed limit %d\n", b.Tokens(), s.Stats().Limit)
	for range 3 {
		window(100, 98, 1)
	}
	fmt.Printf("shed limit %d\n", s.Stats().Limit)
	// Output:
	// db: normal -> degraded
	// db: degraded -> metastable (relief)
	// budget 0 tokens, shed limit 50
	// db: metastable -> normal
	// shed limit 100
}
