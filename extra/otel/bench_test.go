package otel_test

import (
	"context"
	"testing"

	"github.com/guardrail-go/guardrail/event"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/guardrail-go/guardrail"
	gotel "github.com/guardrail-go/guardrail/extra/otel"
)

func okOp(context.Context) (int, error) { return 1, nil }

// BenchmarkDo: the success path of Do without observer, and with the
// Observer on the OpenTelemetry SDK (every span sampled, exported to a
// no-op exporter; metrics to a manual reader). Compare with benchstat -col
// /observer.
func BenchmarkDo(b *testing.B) {
	b.Run("observer=none", func(b *testing.B) {
		benchDo(b, &guardrail.Policy{Name: "pricing"})
	})
	b.Run("observer=otel", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(tracetest.NewNoopExporter()))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		obs, err := gotel.New(gotel.Config{TracerProvider: tp, MeterProvider: mp})
		if err != nil {
			b.Fatal(err)
		}
		defer obs.Close()
		benchDo(b, &guardrail.Policy{Name: "pricing", Observer: obs})
	})
	b.Run("observer=otel-unsampled", func(b *testing.B) {
		tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
		obs, err := gotel.New(gotel.Config{TracerProvider: tp, MeterProvider: mp})
		if err != nil {
			b.Fatal(err)
		}
		defer obs.Close()
		benchDo(b, &guardrail.Policy{Name: "pricing", Observer: obs})
	})
}

func benchDo(b *testing.B, p *guardrail.Policy) {
	ctx := event.WithOperation(context.Background(), "GET /price")
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
}
