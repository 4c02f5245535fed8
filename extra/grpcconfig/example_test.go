package grpcconfig_test

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

	"github.com/guardrail-go/guardrail/extra/config"
	"github.com/guardrail-go/guardrail/extra/grpcconfig"
)

// warming answers UNAVAILABLE to its first call.
type warming struct {
	healthpb.UnimplementedHealthServer
	calls atomic.Int64
}

func (w *warming) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if w.calls.Add(1) == 1 {
		return nil, status.Error(codes.Unavailable, "warming up")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func Example() {
	const file = `
dependencies:
  health:
    kind: grpc
    reason: "Check is a read: safe to repeat, and answers in 50 ms."
    owner: team-platform
    idempotent_methods: [/grpc.health.v1.Health/Check]
    attempt_timeout: 1s
    deadline: 3s
`
	reg, err := config.New("policy.yaml", []byte(file), config.Options{})
	if err != nil {
		log.Fatal(err)
	}

	srv := grpc.NewServer()
	svc := &warming{}
	healthpb.RegisterHealthServer(srv, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	// The dependency's client, installed on a connection; a reload of the
	// file reaches its next call.
	health, err := grpcconfig.NewClient(reg, "health", grpcconfig.Options{})
	if err != nil {
		log.Fatal(err)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, health.DialOptions()...)
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
	cfg, deadline := health.Config()
	fmt.Println(cfg.AttemptTimeout, cfg.IdempotentMethods, deadline)
	// Output:
	// SERVING after 2 calls
	// 1s [/grpc.health.v1.Health/Check] 3s
}
