package storetests

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail/guardgrpc"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
	"github.com/guardrail-go/guardrail/idempotency/pgstore"
	"github.com/guardrail-go/guardrail/idempotency/redisstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgx's pool and go-redis keep background goroutines until Close,
		// which the tests' cleanups call; these are their health checkers.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
	)
}

// charging is a Health service whose Check "charges" once per run.
type charging struct {
	healthpb.UnimplementedHealthServer
	charges atomic.Int64
}

func (c *charging) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	c.charges.Add(1)
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// lossy loses the answer of every fifth call after the handler and the
// key's commit ran: the client sees UNAVAILABLE, as when a connection is
// cut on the way back. (A higher loss rate opens the client's breaker, as
// it should.) lost counts the answers lost.
func lossy(lost *atomic.Int64) grpc.UnaryServerInterceptor {
	var n atomic.Int64
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if n.Add(1)%5 == 1 {
			lost.Add(1)
			return nil, status.Error(codes.Unavailable, "answer lost on the way back")
		}
		return resp, err
	}
}

// testLostAnswers sends payments, each under its own key, through a guarded
// client to a server that loses some answers after it committed. Every
// payment must be charged exactly once, and every lost answer replayed.
func testLostAnswers(t *testing.T, store idempotency.Store) {
	const payments = 50
	srv, err := guardgrpc.NewServer(guardgrpc.ServerConfig{Keys: &guardgrpc.KeyConfig{Store: store, Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	svc := &charging{}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var lost atomic.Int64
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(lossy(&lost), srv.UnaryServerInterceptor()))
	healthpb.RegisterHealthServer(gs, svc)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-done })

	cl, err := guardgrpc.NewClient(guardgrpc.ClientConfig{MaxRetryAfter: -1})
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cl.DialOptions()...)
	conn, err := grpc.NewClient(lis.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	hc := healthpb.NewHealthClient(conn)

	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	replayed := 0
	for i := range payments {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ctx = metadata.AppendToOutgoingContext(ctx, guardgrpc.MDIdempotencyKey, "pay-"+run+"-"+strconv.Itoa(i))
		var header metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "order-" + strconv.Itoa(i)}, grpc.Header(&header))
		cancel()
		if err != nil {
			t.Fatalf("payment %d: %v", i, err)
		}
		if v := header.Get(guardgrpc.MDReplayed); len(v) == 1 && v[0] == "true" {
			replayed++
		}
	}
	if got := svc.charges.Load(); got != payments {
		t.Errorf("%d charges for %d payments, want exactly one each", got, payments)
	}
	if n := lost.Load(); n == 0 || int64(replayed) != n {
		t.Errorf("%d answers replayed, %d lost; want every lost one replayed", replayed, n)
	}
}

func TestLostAnswersChargeOnceMemstore(t *testing.T) {
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	testLostAnswers(t, s)
}

func TestLostAnswersChargeOnceRedis(t *testing.T) {
	addr := os.Getenv("GUARDRAIL_TEST_REDIS_ADDR")
	if addr == "" {
		t.Skip("GUARDRAIL_TEST_REDIS_ADDR is not set (host:port of a Redis server to test against)")
	}
	client := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { client.Close() })
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("Redis at %s: %v", addr, err)
	}
	s, err := redisstore.New(client, redisstore.Config{Prefix: "guardgrpc-test:"})
	if err != nil {
		t.Fatal(err)
	}
	testLostAnswers(t, s)
}

func TestLostAnswersChargeOncePostgres(t *testing.T) {
	dsn := os.Getenv("GUARDRAIL_TEST_POSTGRES_DSN")
	if dsn == "" {
		t.Skip("GUARDRAIL_TEST_POSTGRES_DSN is not set (a PostgreSQL connection string to test against)")
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := pgstore.New(pool, pgstore.Config{Table: "guardgrpc_idempotency_test"})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	testLostAnswers(t, s)
}
