package slogobs_test

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail/slogobs"
)

func Example() {
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{} // no time, for a stable example
			}
			return a
		},
	}))
	obs, err := slogobs.New(slogobs.Config{
		Logger: logger,
		BreakerConfig: func(dependency string) slog.Value {
			return slog.GroupValue(slog.Float64("failure_rate", 0.5), slog.Int("min_requests", 20), slog.Duration("open_for", 30*time.Second))
		},
	})
	if err != nil {
		panic(err)
	}
	defer obs.Close() // writes the summaries of bursts in progress

	// Set it as a Policy's Observer (with event.Join to combine
	// it with metrics); here, events as the breaker and the shedder send them.
	ctx := context.Background()
	obs.Observe(ctx, event.Event{
		Kind: event.BreakerTransition, Dependency: "payments",
		From: "closed", To: "open", Reason: "failure_rate", Detail: "failure rate 0.55 of 20 calls >= 0.5",
		Delay: 33 * time.Second, // the open time, jittered
	})
	obs.Observe(ctx, event.Event{
		Kind: event.Shed, Dependency: "api", Operation: "POST /orders",
		Priority: "sheddable", Reason: event.ReasonCapacity, InFlight: 100, Limit: 100,
	})
	// Output:
	// level=WARN msg="guardrail: breaker transition" dependency=payments from=closed to=open reason=failure_rate cause="failure rate 0.55 of 20 calls >= 0.5" open_for=33s config.failure_rate=0.5 config.min_requests=20 config.open_for=30s
	// level=WARN msg="guardrail: requests shed" dependency=api burst=start operation="POST /orders" priority=sheddable reason=capacity in_flight=100 limit=100 summary_every=10s
}
