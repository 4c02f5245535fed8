package guardgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

// stuck hangs on the first copy of every call, as a server stuck in a
// garbage collection or on a slow disk would, and answers any other copy
// at once.
type stuck struct {
	healthpb.UnimplementedHealthServer
	calls     atomic.Int64
	cancelled chan struct{}
}

func (s *stuck) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	s.calls.Add(1)
	if md, _ := metadata.FromIncomingContext(ctx); len(md[guardgrpc.MDRetryAttempt]) == 0 {
		<-ctx.Done() // the client cancels it once the hedge has answered
		close(s.cancelled)
		return nil, ctx.Err()
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func ExampleClientConfig_hedge() {
	srv := grpc.NewServer()
	svc := &stuck{cancelled: make(chan struct{})}
	healthpb.RegisterHealthServer(srv, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	// Check is safe to repeat: a copy that has not answered within 50 ms
	// gets a second one, and the first answer wins. A fixed delay keeps
	// the example exact; the zero HedgeConfig hedges after the 95th
	// percentile of recent latencies instead.
	client, err := guardgrpc.NewClient(guardgrpc.ClientConfig{
		IdempotentMethods: []string{"/grpc.health.v1.Health/Check"},
		Hedge:             &guardrail.HedgeConfig{Delay: 50 * time.Millisecond},
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

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		log.Fatal(err)
	}
	<-svc.cancelled
	fmt.Println(resp.Status, "after", svc.calls.Load(), "copies; the stuck one was cancelled")
	// Output: SERVING after 2 copies; the stuck one was cancelled
}
