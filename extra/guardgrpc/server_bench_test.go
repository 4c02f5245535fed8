package guardgrpc_test

import (
	"context"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/shed"
)

// BenchmarkShedCall is one call refused by a full server over loopback
// TCP, through ServerOptions and through the unary interceptor alone: what
// a refusal costs the server and the caller.
func BenchmarkShedCall(b *testing.B) {
	for _, row := range []struct {
		name string
		opts func(*guardgrpc.Server) []grpc.ServerOption
	}{
		{"ServerOptions", func(s *guardgrpc.Server) []grpc.ServerOption { return s.ServerOptions() }},
		{"interceptor", func(s *guardgrpc.Server) []grpc.ServerOption {
			return []grpc.ServerOption{grpc.UnaryInterceptor(s.UnaryServerInterceptor())}
		}},
	} {
		b.Run(row.name, func(b *testing.B) {
			sh := newShedder(b, shed.Config{Limit: 1})
			tok, err := sh.Acquire(context.Background(), shed.Critical) // the server is full
			if err != nil {
				b.Fatal(err)
			}
			defer tok.Release()
			cl := dial(b, serve(b, &health{}, row.opts(newServer(b, guardgrpc.ServerConfig{Shedder: sh}))...), nil)
			ctx := context.Background()
			req := &healthpb.HealthCheckRequest{}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := cl.Check(ctx, req); status.Code(err) != codes.Unavailable {
					b.Fatalf("call to a full server: %v, want UNAVAILABLE", err)
				}
			}
		})
	}
}

// BenchmarkAdmittedCall is one call admitted by a Shedder with room, over
// loopback TCP, through ServerOptions.
func BenchmarkAdmittedCall(b *testing.B) {
	sh := newShedder(b, shed.Config{Limit: 100})
	cl := dial(b, serve(b, &health{}, newServer(b, guardgrpc.ServerConfig{Shedder: sh}).ServerOptions()...), nil)
	ctx := context.Background()
	req := &healthpb.HealthCheckRequest{}
	if _, err := cl.Check(ctx, req); err != nil { // connect outside the timing
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := cl.Check(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}
