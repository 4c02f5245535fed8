package grpcfault_test

import (
	"context"
	"fmt"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/guardrail-go/guardrail/extra/guardgrpc/grpcfault"
	"github.com/guardrail-go/guardrail/fault"
)

// A gRPC server whose Check answers RESOURCE_EXHAUSTED with a pushback,
// from the same rule file format as HTTP faults.
func Example() {
	cfg, err := fault.ParseConfig([]byte(`{"rules": [{
		"match": {"path": "/grpc.health.v1.Health/Check"},
		"kind": "error", "grpc_code": "RESOURCE_EXHAUSTED", "retry_after": "2s"}]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	in, err := fault.New(cfg)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer in.Close()

	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(grpcfault.UnaryServerInterceptor(in)),
		grpc.ChainStreamInterceptor(grpcfault.StreamServerInterceptor(in)))
	healthpb.RegisterHealthServer(srv, &health{})
	lis := bufconn.Listen(1 << 16)
	go func() { _ = srv.Serve(lis) }()
	defer srv.Stop()

	cc, err := grpc.NewClient("passthrough:///pricing",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }))
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cc.Close()

	var trailer metadata.MD
	_, err = healthpb.NewHealthClient(cc).Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	fmt.Println(status.Code(err), trailer.Get("grpc-retry-pushback-ms"))
	fmt.Println(in.Counters()[0].Fired, "fired")
	// Output:
	// ResourceExhausted [2000]
	// 1 fired
}
