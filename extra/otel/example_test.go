package otel_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	gotel "github.com/guardrail-go/guardrail/extra/otel"
)

func Example() {
	spans := tracetest.NewSpanRecorder() // in production: an OTLP exporter
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, err := gotel.New(gotel.Config{TracerProvider: tp}) // meter: the global one
	if err != nil {
		panic(err)
	}
	defer obs.Close()

	p := &guardrail.Policy{Name: "pricing", Idempotent: true, Retry: guardrail.Retry{Backoff: backoff.None()}, Observer: obs}
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
			case "guardrail.attempt", "guardrail.outcome", "guardrail.attempts":
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
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Println("traceparent:", r.Header.Get("traceparent"))
	}))
	defer srv.Close()
	// Pass the wrapped transport to the guarded HTTP client as its base.
	client := &http.Client{Transport: gotel.Transport(srv.Client().Transport, propagation.TraceContext{})}

	// The context an attempt runs with holds its span; here, a span of a
	// known trace.
	ctx := trace.ContextWithSpanContext(context.Background(), trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36},
		SpanID:     trace.SpanID{0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7},
		TraceFlags: trace.FlagsSampled,
	}))
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL, nil)
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	client.CloseIdleConnections()
	// Output:
	// traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
}

// A server joins its caller's trace with the Observer's Middleware: the
// guarded calls its handler makes are spans of the caller's trace.
func ExampleObserver_Middleware() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	obs, err := gotel.New(gotel.Config{TracerProvider: tp, Propagator: propagation.TraceContext{}})
	if err != nil {
		panic(err)
	}
	defer obs.Close()

	p := &guardrail.Policy{Name: "db", Observer: obs}
	handler := obs.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = guardrail.Do(r.Context(), p, func(context.Context) (int, error) { return 1, nil })
	}))

	req := httptest.NewRequest(http.MethodGet, "/orders/1", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	handler.ServeHTTP(httptest.NewRecorder(), req)

	for _, s := range spans.Ended() {
		if s.Name() == "guardrail.call" {
			fmt.Println(s.Name(), "trace", s.SpanContext().TraceID(), "parent", s.Parent().SpanID())
		}
	}
	// Output:
	// guardrail.call trace 4bf92f3577b34da6a3ce929d0e0e4736 parent 00f067aa0ba902b7
}
