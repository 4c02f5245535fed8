package guardgrpc_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	checkMethod = "/grpc.health.v1.Health/Check"
	watchMethod = "/grpc.health.v1.Health/Watch"
)

// health is a Health service whose answers the test scripts. calls counts
// the calls that reached it.
type health struct {
	healthpb.UnimplementedHealthServer
	calls atomic.Int64
	check func(ctx context.Context, n int64, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error)
	watch func(n int64, req *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error
}

func (h *health) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	n := h.calls.Add(1)
	if h.check == nil {
		return serving, nil
	}
	return h.check(ctx, n, req)
}

func (h *health) Watch(req *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error {
	n := h.calls.Add(1)
	if h.watch == nil {
		return s.Send(serving)
	}
	return h.watch(n, req, s)
}

var serving = &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}

// serve starts a gRPC server for h on 127.0.0.1 and returns its address.
func serve(t testing.TB, h healthpb.HealthServer, opts ...grpc.ServerOption) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		srv.Serve(lis)
	}()
	t.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return lis.Addr().String()
}

// dial connects to addr through c.
func dial(t testing.TB, addr string, c *guardgrpc.Client, opts ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	if c != nil {
		opts = append(opts, c.DialOptions()...)
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func newClient(t testing.TB, cfg guardgrpc.ClientConfig) *guardgrpc.Client {
	t.Helper()
	if cfg.Backoff == nil {
		cfg.Backoff = backoff.Constant(time.Millisecond)
	}
	c, err := guardgrpc.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func newServer(t testing.TB, cfg guardgrpc.ServerConfig) *guardgrpc.Server {
	t.Helper()
	s, err := guardgrpc.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

var bulkheadCfg = bulkhead.Config{MaxConcurrent: 2}

func newGroup(t testing.TB, cfg breaker.Config) *breaker.Group {
	t.Helper()
	g, err := breaker.NewGroup(breaker.GroupConfig{Config: cfg})
	if err != nil {
		t.Fatal(err)
	}
	return g
}
