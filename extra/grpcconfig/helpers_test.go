package grpcconfig_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/guardrail-go/guardrail/extra/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const checkMethod = "/grpc.health.v1.Health/Check"

// health is a Health service whose answers the test scripts; calls counts
// the calls that reached it.
type health struct {
	healthpb.UnimplementedHealthServer
	calls atomic.Int64
	check atomic.Pointer[func(ctx context.Context, n int64) (*healthpb.HealthCheckResponse, error)]
}

func (h *health) script(f func(ctx context.Context, n int64) (*healthpb.HealthCheckResponse, error)) {
	h.check.Store(&f)
}

func (h *health) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	n := h.calls.Add(1)
	if f := h.check.Load(); f != nil {
		return (*f)(ctx, n)
	}
	return serving, nil
}

func (h *health) Watch(_ *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error {
	h.calls.Add(1)
	return s.Send(serving)
}

var serving = &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}

// serve starts a gRPC server for h on 127.0.0.1 and returns its address.
func serve(t testing.TB, h healthpb.HealthServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
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

// dial connects to addr with opts, which install the client.
func dial(t testing.TB, addr string, opts []grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

func newRegistry(t testing.TB, file string) *config.Registry {
	t.Helper()
	reg, err := config.New("policy.yaml", []byte(file), config.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return reg
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
