package otel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	gotel "github.com/guardrail-go/guardrail/observe/otel"
)

func Example() {
	spans := tracetest.NewSpanRecorder() // in production: an OTLP exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, err := gotel.New(gotel.Config{TracerProvider: tp}) // meter: the global one
	if err != nil {
		panic(err)
	}
	defer obs.Close()

	p := &guardrail.Policy{Name: "pricing", Idempotent: true, Backoff: backoff.None(), Observer: obs}
	calls := 0
	_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
		calls++
		if calls < 3 {
			return 0, guardrail.Transient(errors.New("503 from pricing"))
		}
		return 100, nil
	})

	for _, s := range spans.Ended() {
		fmt.Print(s.Name())
		for _, a := range s.Attributes() {
			switch a.Key {
			case gotel.AttrAttempt, gotel.AttrOutcome, gotel.AttrAttempts:
				fmt.Printf(" %s=%s", a.Key, a.Value.String())
			}
		}
		fmt.Println()
	}
	// Output:
	// guardrail.attempt guardrail.attempt=1 guardrail.outcome=failure
	// guardrail.attempt guardrail.attempt=2 guardrail.outcome=failure
	// guardrail.attempt guardrail.attempt=3 guardrail.outcome=success
	// guardrail.call guardrail.outcome=ok guardrail.attempts=3
}

// Trace context reaches the dependency when the transport under the guarded
// client injects it: each attempt's request carries that attempt's span.
func ExampleTransport() {
	client := &http.Client{Transport: gotel.Transport(http.DefaultTransport, propagation.TraceContext{})}
	_ = client // pass it (or its Transport) to the guarded HTTP client
}
