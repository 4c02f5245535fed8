package guardgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/shed"
)

// flaky answers UNAVAILABLE to its first call.
type flaky struct {
	healthpb.UnimplementedHealthServer
	calls atomic.Int64
}

func (f *flaky) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if f.calls.Add(1) == 1 {
		return nil, status.Error(codes.Unavailable, "warming up")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func Example() {
	// Server: shed under overload, clamp deadlines to 5 s.
	sh, err := shed.New(shed.Config{})
	if err != nil {
		log.Fatal(err)
	}
	guard, err := guardgrpc.NewServer(guardgrpc.ServerConfig{Shedder: sh, MaxTimeout: 5 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(guard.ServerOptions()...)
	svc := &flaky{}
	healthpb.RegisterHealthServer(srv, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	// Client: Check is safe to repeat, so its UNAVAILABLE is retried.
	client, err := guardgrpc.NewClient(guardgrpc.ClientConfig{
		IdempotentMethods: []string{"/grpc.health.v1.Health/Check"},
		Retry: guardrail.Retry{
			AttemptTimeout: time.Second,
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, client.DialOptions()...)
	conn, err := grpc.NewClient(lis.Addr().String(), opts...)
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(resp.Status, "after", svc.calls.Load(), "calls")
	// Output: SERVING after 2 calls
}
