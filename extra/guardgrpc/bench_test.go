package guardgrpc_test

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

// hedgeRows are a Client without hedging and one whose hedge is never
// due (a fixed delay of a minute): what hedging costs a call that answers
// in time, the common case.
func hedgeRows(b *testing.B) []struct {
	name string
	c    *guardgrpc.Client
} {
	plain := newClient(b, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, ConnRetriesDisabled: true})
	hedged := newClient(b, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, ConnRetriesDisabled: true,
		Hedge: &guardrail.HedgeConfig{Delay: time.Minute}})
	return []struct {
		name string
		c    *guardgrpc.Client
	}{{"hedge=off", plain}, {"hedge=on", hedged}}
}

// BenchmarkUnaryHedgeNotDue is one unary call over loopback TCP.
func BenchmarkUnaryHedgeNotDue(b *testing.B) {
	addr := serve(b, &health{})
	req := &healthpb.HealthCheckRequest{}
	for _, row := range hedgeRows(b) {
		b.Run(row.name, func(b *testing.B) {
			cl := dial(b, addr, row.c)
			ctx := context.Background()
			if _, err := cl.Check(ctx, req); err != nil { // connect outside the timing
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := cl.Check(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkInterceptorHedgeNotDue is the unary interceptor alone, around
// an invoker that answers at once: the overhead without the round trip
// whose variance hides it.
func BenchmarkInterceptorHedgeNotDue(b *testing.B) {
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	req, reply := &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}
	// A connection that never connects: the interceptor reads its target.
	conn, err := grpc.NewClient("passthrough:///127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	for _, row := range hedgeRows(b) {
		b.Run(row.name, func(b *testing.B) {
			in := row.c.UnaryClientInterceptor()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := in(ctx, checkMethod, req, reply, conn, invoker); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
