package grpcfault_test

import (
	"context"
	"fmt"
	"testing"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/guardrail-go/guardrail/extra/guardgrpc/grpcfault"
	"github.com/guardrail-go/guardrail/fault"
)

// The cost of the server interceptor on a call that gets no fault, against
// the bare handler: what an Injector left in front of a service costs.
func BenchmarkUnaryServerPassThrough(b *testing.B) {
	handler := func(context.Context, any) (any, error) { return nil, nil }
	info := &grpc.UnaryServerInfo{FullMethod: "/pricing.v1.Pricing/Quote"}
	ctx := metadata.NewIncomingContext(context.Background(),
		metadata.Pairs(":authority", "pricing.internal:50051", "x-tenant", "prod"))
	miss := func(n int) []fault.Rule {
		rules := make([]fault.Rule, n)
		for i := range rules {
			rules[i] = fault.Rule{Name: fmt.Sprint("r", i), Match: fault.Match{Path: "/orders.v1.Orders/**",
				Headers: map[string]string{"X-Tenant": "canary"}}, Fault: fault.Status{}}
		}
		return rules
	}
	b.Run("baseline", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = handler(ctx, nil)
		}
	})
	for _, c := range []struct {
		name  string
		rules []fault.Rule
	}{
		{"no-rules", nil},
		{"1-rule-path-miss", miss(1)},
		{"10-rules-miss", miss(10)},
		{"1-rule-header-miss", []fault.Rule{{Match: fault.Match{Headers: map[string]string{"X-Tenant": "canary"}}, Fault: fault.Status{}}}},
	} {
		b.Run(c.name, func(b *testing.B) {
			in := newInjector(b, c.rules...)
			icpt := grpcfault.UnaryServerInterceptor(in)
			b.ReportAllocs()
			for b.Loop() {
				_, _ = icpt(ctx, nil, info, handler)
			}
		})
	}
}

// The same over a real gRPC round trip (in memory), where the
// interceptor's cost is set against a call's.
func BenchmarkUnaryServerRoundTrip(b *testing.B) {
	req := &healthpb.HealthCheckRequest{}
	b.Run("baseline", func(b *testing.B) {
		c := serve(b, &health{}, nil, nil)
		b.ReportAllocs()
		for b.Loop() {
			_, _ = c.Check(context.Background(), req)
		}
	})
	b.Run("1-rule-path-miss", func(b *testing.B) {
		in := newInjector(b, fault.Rule{Match: fault.Match{Path: "/orders.v1.Orders/**"}, Fault: fault.Status{}})
		c := serve(b, &health{}, in, nil)
		b.ReportAllocs()
		for b.Loop() {
			_, _ = c.Check(context.Background(), req)
		}
	})
}
