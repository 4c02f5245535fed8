package prom_test

import (
	"context"
	"testing"

	"github.com/guardrail-go/guardrail/event"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/extra/prom"
)

func okOp(context.Context) (int, error) { return 1, nil }

// BenchmarkDo compares the success path of guardrail.Do without an
// observer (the baseline), with an observer that does nothing (what Do
// itself spends to report events: mostly clock reads) and with a registered
// Collector, in one run. Compare with benchstat -col /observer.
func BenchmarkDo(b *testing.B) {
	b.Run("observer=none", func(b *testing.B) {
		p := &guardrail.Policy{Name: "pricing"}
		benchDo(b, p)
	})
	b.Run("observer=nop", func(b *testing.B) {
		nop := event.ObserverFunc(func(ctx context.Context, _ event.Event) context.Context { return ctx })
		p := &guardrail.Policy{Name: "pricing", Observer: nop}
		benchDo(b, p)
	})
	b.Run("observer=prom", func(b *testing.B) {
		c := newCollector(b, prom.Config{})
		prometheus.NewRegistry().MustRegister(c)
		p := &guardrail.Policy{Name: "pricing", Observer: c}
		benchDo(b, p)
	})
}

func benchDo(b *testing.B, p *guardrail.Policy) {
	ctx := event.WithOperation(context.Background(), "GET /price")
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
}

// BenchmarkObserveSuccessPath is the collector's own share of a successful
// call: the four events Do emits, without Do's clock reads. It should be
// close to the difference between observer=prom and observer=nop above.
func BenchmarkObserveSuccessPath(b *testing.B) {
	c := newCollector(b, prom.Config{})
	ctx := context.Background()
	ev := func(k event.Kind, outcome string) event.Event {
		return event.Event{Kind: k, Dependency: "pricing", Operation: "GET /price", Attempt: 1, Outcome: outcome, Remaining: -1}
	}
	start, astart := ev(event.CallStart, ""), ev(event.AttemptStart, "")
	aend, end := ev(event.AttemptEnd, event.AttemptSuccess), ev(event.CallEnd, event.OutcomeOK)
	b.ReportAllocs()
	for b.Loop() {
		c.Observe(ctx, start)
		c.Observe(ctx, astart)
		c.Observe(ctx, aend)
		c.Observe(ctx, end)
	}
}
