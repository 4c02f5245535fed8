package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

// The chain's RPC is grpc-go's health check, so that no generated code is
// needed: every tier serves it and calls the next tier's.
const ampGRPCService = "/grpc.health.v1.Health/"

// tierHealth is one tier of the gRPC chain: its Check calls the next
// tier's, and answers UNAVAILABLE when that failed, as the HTTP tiers
// answer 502.
type tierHealth struct {
	healthpb.UnimplementedHealthServer
	next   healthpb.HealthClient
	flight *inFlight // nil: not counted
}

func (h *tierHealth) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if h.flight != nil {
		defer h.flight.enter()()
	}
	if _, err := h.next.Check(ctx, req); err != nil {
		return nil, status.Error(codes.Unavailable, "downstream failed")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// grpcServer is a gRPC server on a loopback port of its own.
type grpcServer struct {
	Addr string
	srv  *grpc.Server
	wg   sync.WaitGroup
}

func serveGRPC(h healthpb.HealthServer, opts ...grpc.ServerOption) (*grpcServer, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &grpcServer{Addr: ln.Addr().String(), srv: grpc.NewServer(opts...)}
	healthpb.RegisterHealthServer(s.srv, h)
	s.wg.Go(func() { _ = s.srv.Serve(ln) })
	return s, nil
}

// Close stops the server at once, cutting open connections.
func (s *grpcServer) Close() {
	s.srv.Stop()
	s.wg.Wait()
}

// dialGRPC returns a connection to addr, on loopback, without TLS.
func dialGRPC(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, opts...)
	return grpc.NewClient("passthrough:///"+addr, opts...)
}

// ampGRPCAttemptTimeout bounds an attempt of the data-service: the dead DB
// fails it at once, so only a stuck machine reaches it, and the run then
// ends instead of hanging.
const ampGRPCAttemptTimeout = 10 * time.Second

// errSecondDial refuses a second connection for one attempt.
var errSecondDial = errors.New("lab: one connection per attempt")

// freshConnAttempt is the data-service's guardgrpc.AttemptFunc: each
// attempt opens a connection of its own to the DB, sends the call on it
// once and closes it, as the HTTP data-service opens a connection per call.
// On one long-lived connection grpc-go would fail most attempts at once,
// without dialing, while it backs off reconnecting to a dead address
// (TRANSIENT_FAILURE): the DB would not hear the retries the rows count.
// An attempt dials once: were grpc-go to reconnect (after its backoff,
// on a machine too busy to close the connection first), the second dial
// fails without reaching the DB, so the DB counts attempts, not dials.
func freshConnAttempt(addr string, dial func(context.Context, string, string) (net.Conn, error)) guardgrpc.AttemptFunc {
	if dial == nil {
		var d net.Dialer
		dial = d.DialContext
	}
	return func(ctx context.Context, a *guardgrpc.Attempt) error {
		var dialed atomic.Bool
		cc, err := dialGRPC(addr, grpc.WithDisableRetry(), grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			if dialed.Swap(true) {
				return nil, errSecondDial
			}
			return dial(ctx, "tcp", addr)
		}))
		if err != nil {
			return err
		}
		defer cc.Close()
		return cc.Invoke(ctx, a.Method, a.Req, a.Reply, a.Opts...)
	}
}

// grpcScenario is scenario over gRPC: tiers of gRPC servers, each calling
// the next through a guardgrpc client, in front of a dead DB. It returns
// the DB calls the DB (or the data-service's dialer) saw; peak counts the
// calls in the data-service.
func (p ampParams) grpcScenario(ctx context.Context, allTiers bool, ratio float64, users int, over time.Duration, withBreaker bool, peak *inFlight) (int64, error) {
	var dbAddr string
	var count func() int64
	var dial func(context.Context, string, string) (net.Conn, error)
	switch p.dbMode {
	case "reset":
		db, err := listenReset()
		if err != nil {
			return 0, err
		}
		defer db.Close()
		dbAddr, count = db.Addr, db.calls.Load
	case "refused":
		addr, err := closedPort()
		if err != nil {
			return 0, err
		}
		d := &countingDialer{}
		dbAddr, count, dial = addr, d.dials.Load, d.DialContext
	}

	var closers []func()
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	next := dbAddr
	// Build from the DB up: tier 0 is the data-service, nearest the DB.
	for i := 0; i < p.tiers; i++ {
		cfg := guardgrpc.ClientConfig{
			Name:              fmt.Sprintf("tier%d", i),
			IdempotentMethods: []string{ampGRPCService},
			// The rows measure retries alone: breakers off unless the row
			// asks for guardgrpc's default one.
			Breakers: noBreakers(),
		}
		var err error
		if cfg.Retry, err = p.tierRetry(i, allTiers, ratio); err != nil {
			return 0, err
		}
		if i == 0 {
			cfg.AttemptTimeout = ampGRPCAttemptTimeout
			if withBreaker {
				cfg.Breakers = nil // guardgrpc's default: one breaker per target
			}
			cfg.Attempt = freshConnAttempt(dbAddr, dial)
		}
		client, err := guardgrpc.NewClient(cfg)
		if err != nil {
			return 0, err
		}
		// The data-service's connection is never dialed: its attempts go
		// through connections of their own. It names the breaker's target.
		cc, err := dialGRPC(next, client.DialOptions()...)
		if err != nil {
			return 0, err
		}
		closers = append(closers, func() { _ = cc.Close() })
		h := &tierHealth{next: healthpb.NewHealthClient(cc)}
		if i == 0 {
			h.flight = peak
		}
		s, err := serveGRPC(h)
		if err != nil {
			return 0, err
		}
		closers = append(closers, s.Close)
		next = s.Addr
	}

	userConn, err := dialGRPC(next, grpc.WithDisableRetry())
	if err != nil {
		return 0, err
	}
	closers = append(closers, func() { _ = userConn.Close() })
	user := healthpb.NewHealthClient(userConn)
	check := func() { _, _ = user.Check(ctx, &healthpb.HealthCheckRequest{}) }
	var wg sync.WaitGroup
	start := time.Now()
	for u := range users {
		if over > 0 {
			at := start.Add(time.Duration(int64(over) * int64(u) / int64(users)))
			if err := sleepUntil(ctx, at); err != nil {
				wg.Wait()
				return 0, err
			}
			wg.Go(check)
			continue
		}
		if check(); ctx.Err() != nil {
			return 0, ctx.Err()
		}
	}
	wg.Wait()
	return count(), ctx.Err()
}
