package guardgrpc_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

// payments charges once per run of Check; the service "crash" panics
// after its charge, and "refused" panics having committed nothing.
type payments struct {
	healthpb.UnimplementedHealthServer
	charges atomic.Int64
}

func (p *payments) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if req.Service == "refused" {
		// Nothing was charged: say so, so that a retry may run again.
		if err := idempotency.Release(ctx); err != nil {
			return nil, status.Error(codes.Internal, err.Error())
		}
		panic("the bank refused the connection")
	}
	p.charges.Add(1)
	if req.Service == "crash" {
		panic("charged, then failed to write the receipt")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// recoverPanics turns a handler's panic into INTERNAL. It must run outside
// guardgrpc's interceptor, which records the panic and re-raises it.
func recoverPanics(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = status.Errorf(codes.Internal, "panic: %v", v)
		}
	}()
	return handler(ctx, req)
}

func ExampleKeyConfig() {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		log.Fatal(err)
	}
	guard, err := guardgrpc.NewServer(guardgrpc.ServerConfig{Keys: &guardgrpc.KeyConfig{
		Store: store,
		// Keys are scoped by caller. A real server reads the caller that
		// its authentication interceptor (run before this one) found;
		// here a metadata entry stands for it.
		Scope: func(ctx context.Context) (string, error) {
			if v := metadata.ValueFromIncomingContext(ctx, "x-account"); len(v) == 1 {
				return v[0], nil
			}
			return "", errors.New("no account")
		},
		Logger: slog.New(slog.DiscardHandler),
	}})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(recoverPanics, guard.UnaryServerInterceptor()))
	svc := &payments{}
	healthpb.RegisterHealthServer(srv, svc)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go srv.Serve(lis)
	defer srv.Stop()

	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)

	pay := func(account, key, service string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		ctx = metadata.AppendToOutgoingContext(ctx, guardgrpc.MDIdempotencyKey, key)
		if account != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-account", account)
		}
		var header metadata.MD
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: service}, grpc.Header(&header))
		replayed := len(header.Get(idempotency.HeaderReplayed)) == 1
		if account == "" {
			account = "-"
		}
		fmt.Printf("%-8s %-7s %-16v replayed=%-5v charges=%d\n", key, account, status.Code(err), replayed, svc.charges.Load())
	}
	pay("alice", "k1", "order")
	pay("alice", "k1", "order") // a retry: the stored answer
	pay("bob", "k1", "order")   // another caller's key k1: its own
	pay("", "k1", "order")      // not attributed: refused, not run
	pay("alice", "k2", "crash") // charged, then panicked
	pay("alice", "k2", "crash") // outcome unknown: not charged again
	pay("alice", "k3", "refused")
	pay("alice", "k3", "order") // released: runs again (here, with another request)
	// Output:
	// k1       alice   OK               replayed=false charges=1
	// k1       alice   OK               replayed=true  charges=1
	// k1       bob     OK               replayed=false charges=2
	// k1       -       PermissionDenied replayed=false charges=2
	// k2       alice   Internal         replayed=false charges=3
	// k2       alice   Internal         replayed=true  charges=3
	// k3       alice   Internal         replayed=false charges=3
	// k3       alice   OK               replayed=false charges=4
}
