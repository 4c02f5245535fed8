package bench

import (
	"context"
	"net"
	"testing"

	"github.com/failsafe-go/failsafe-go"
	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafegrpc"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

// BenchmarkGRPCUnary is the cost of one unary call over loopback TCP to
// grpc-go's own health service: a plain grpc-go client, the same with
// guardgrpc's interceptors (the zero ClientConfig plus the method marked
// idempotent: retries, budget, a breaker per target), and failsafe-go's
// failsafegrpc interceptor with a retry policy and a circuit breaker, the
// nearest equivalent. Every row sends the same request to the same server
// over a connection of its own.
func BenchmarkGRPCUnary(b *testing.B) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := grpc.NewServer()
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(lis)
	defer srv.Stop()
	addr := lis.Addr().String()

	guard, err := guardgrpc.NewClient(guardgrpc.ClientConfig{
		IdempotentMethods: []string{"/grpc.health.v1.Health/Check"},
	})
	if err != nil {
		b.Fatal(err)
	}
	fsRetry := failsafegrpc.NewRetryPolicyBuilder[any]().Build()
	fsBreaker := circuitbreaker.NewBuilder[any]().Build()
	rows := []struct {
		name string
		opts []grpc.DialOption
	}{
		{"client=plain", nil},
		{"client=guardgrpc", guard.DialOptions()},
		{"client=failsafegrpc", []grpc.DialOption{grpc.WithUnaryInterceptor(
			failsafegrpc.NewUnaryClientInterceptorWithExecutor(failsafe.With[any](fsRetry, fsBreaker)))}},
	}
	req := &healthpb.HealthCheckRequest{}
	for _, row := range rows {
		b.Run(row.name, func(b *testing.B) {
			opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, row.opts...)
			conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			cl := healthpb.NewHealthClient(conn)
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

// BenchmarkGRPCInterceptor is the cost of the unary client interceptors
// alone, around an invoker that answers at once: what each adds to a call,
// without the loopback round trip whose variance hides it in
// BenchmarkGRPCUnary. The plain row calls the invoker directly.
func BenchmarkGRPCInterceptor(b *testing.B) {
	guard, err := guardgrpc.NewClient(guardgrpc.ClientConfig{
		IdempotentMethods:   []string{"/grpc.health.v1.Health/Check"},
		ConnRetriesDisabled: true, // as DialOptions would have set up
	})
	if err != nil {
		b.Fatal(err)
	}
	fsRetry := failsafegrpc.NewRetryPolicyBuilder[any]().Build()
	fsBreaker := circuitbreaker.NewBuilder[any]().Build()
	invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error { return nil }
	plain := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	rows := []struct {
		name string
		ic   grpc.UnaryClientInterceptor
	}{
		{"client=plain", plain},
		{"client=guardgrpc", guard.UnaryClientInterceptor()},
		{"client=failsafegrpc", failsafegrpc.NewUnaryClientInterceptorWithExecutor(failsafe.With[any](fsRetry, fsBreaker))},
	}
	conn, err := grpc.NewClient("passthrough:///127.0.0.1:1", grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	req, reply := &healthpb.HealthCheckRequest{}, &healthpb.HealthCheckResponse{}
	for _, row := range rows {
		b.Run(row.name, func(b *testing.B) {
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := row.ic(ctx, "/grpc.health.v1.Health/Check", req, reply, conn, invoker); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
