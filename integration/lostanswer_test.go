package integration

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
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

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/extra/pgstore"
	"github.com/guardrail-go/guardrail/extra/redisstore"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// pgx's pool and go-redis keep background goroutines until Close,
		// which the tests' cleanups call; these are their health checkers.
		goleak.IgnoreTopFunction("github.com/jackc/pgx/v5/pgxpool.(*Pool).backgroundHealthCheck"),
		goleak.Cleanup(stopCluster),
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

// guarded serves svc behind the outer interceptors (outermost first) and a
// guardgrpc Server with keys in store, and returns a client of it through
// a guarded client, which retries UNAVAILABLE on calls with a key.
func guarded(t *testing.T, store idempotency.Store, svc healthpb.HealthServer, outer ...grpc.UnaryServerInterceptor) healthpb.HealthClient {
	t.Helper()
	srv, err := guardgrpc.NewServer(guardgrpc.ServerConfig{Keys: &guardgrpc.KeyConfig{Store: store, SingleTenant: true, Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(append(outer, srv.UnaryServerInterceptor())...))
	healthpb.RegisterHealthServer(gs, svc)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-done })

	cl, err := guardgrpc.NewClient(guardgrpc.ClientConfig{Retry: guardrail.Retry{MaxRetryAfter: -1}})
	if err != nil {
		t.Fatal(err)
	}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cl.DialOptions()...)
	conn, err := grpc.NewClient(lis.Addr().String(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// testLostAnswers sends payments, each under its own key, through a guarded
// client to a server that loses some answers after it committed. Every
// payment must be charged exactly once, and every lost answer replayed.
func testLostAnswers(t *testing.T, store idempotency.Store) {
	const payments = 50
	svc := &charging{}
	var lost atomic.Int64
	hc := guarded(t, store, svc, lossy(&lost))

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
		if v := header.Get(idempotency.HeaderReplayed); len(v) == 1 && v[0] == "true" {
			replayed++
		}
	}
	if got := svc.charges.Load(); got != payments {
		t.Errorf("%d charges for %d payments, want exactly one each", got, payments)
	}
	if n := lost.Load(); n == 0 || int64(replayed) != n {
		t.Errorf("%d answers replayed, %d lost; want every lost one replayed", replayed, n)
	}
	t.Logf("%d payments, %d charges, %d answers lost and replayed", payments, svc.charges.Load(), replayed)
}

// panicking is a Health service that charges each order, except that
// orders whose number is 1 mod 5 panic right after their charge, and
// orders 3 mod 5 panic without charging on their first run, having called
// idempotency.Release. charges counts the charges per order.
type panicking struct {
	healthpb.UnimplementedHealthServer
	mu      sync.Mutex
	charges map[string]int
	runs    map[string]int
}

func (p *panicking) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	n, _ := strconv.Atoi(strings.TrimPrefix(req.Service, "order-"))
	p.mu.Lock()
	p.runs[req.Service]++
	first := p.runs[req.Service] == 1
	if n%5 == 3 && first {
		p.mu.Unlock()
		if err := idempotency.Release(ctx); err != nil {
			panic(err)
		}
		panic("failed before charging")
	}
	p.charges[req.Service]++
	p.mu.Unlock()
	if n%5 == 1 {
		panic("failed after charging")
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// recovering is the outermost interceptor: it turns a panic into
// UNAVAILABLE, as a client sees a server that died mid-call, so the
// guarded client retries with the same key. panics counts them.
func recovering(panics *atomic.Int64) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
		defer func() {
			if v := recover(); v != nil {
				panics.Add(1)
				err = status.Errorf(codes.Unavailable, "handler panicked: %v", v)
			}
		}()
		return handler(ctx, req)
	}
}

// testPanicAfterCharge sends payments, each under its own key, to a server
// whose handler sometimes panics after it charged. The retry of such a
// payment must get the unknown-outcome answer, not a second charge; the
// retry of one that released its key before panicking runs and charges.
func testPanicAfterCharge(t *testing.T, store idempotency.Store) {
	const payments = 20
	svc := &panicking{charges: map[string]int{}, runs: map[string]int{}}
	var panics atomic.Int64
	hc := guarded(t, store, svc, recovering(&panics))

	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	unknown, released := 0, 0
	for i := range payments {
		order := "order-" + strconv.Itoa(i)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ctx = metadata.AppendToOutgoingContext(ctx, guardgrpc.MDIdempotencyKey, "pay-"+run+"-"+strconv.Itoa(i))
		var header metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: order}, grpc.Header(&header))
		cancel()
		replayed := len(header.Get(idempotency.HeaderReplayed)) == 1
		switch i % 5 {
		case 1:
			if status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), "outcome unknown") || !replayed {
				t.Errorf("payment %d, panicked after charging: %v (replayed %v); want the replayed INTERNAL outcome unknown", i, err, replayed)
			}
			unknown++
		case 3:
			if err != nil || replayed {
				t.Errorf("payment %d, released then panicked: %v (replayed %v); want the retry to run and succeed", i, err, replayed)
			}
			released++
		default:
			if err != nil {
				t.Errorf("payment %d: %v", i, err)
			}
		}
	}
	svc.mu.Lock()
	defer svc.mu.Unlock()
	total := 0
	for i := range payments {
		order := "order-" + strconv.Itoa(i)
		total += svc.charges[order]
		if c := svc.charges[order]; c != 1 {
			t.Errorf("%s charged %d times in %d runs, want exactly once", order, c, svc.runs[order])
		}
	}
	if want := int64(unknown + released); panics.Load() != want {
		t.Errorf("%d panics reached the recovering interceptor, want %d: each is re-raised once", panics.Load(), want)
	}
	t.Logf("%d payments, %d charges, %d panics (%d after charging, answered outcome unknown; %d released, run again)",
		payments, total, panics.Load(), unknown, released)
}

func TestLostAnswersChargeOnceMemstore(t *testing.T) { testLostAnswers(t, newMemstore(t)) }

func TestPanicAfterChargeMemstore(t *testing.T) { testPanicAfterCharge(t, newMemstore(t)) }

func newMemstore(tb testing.TB) idempotency.Store {
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func TestLostAnswersChargeOnceRedis(t *testing.T) { testLostAnswers(t, newRedis(t)) }

func TestPanicAfterChargeRedis(t *testing.T) { testPanicAfterCharge(t, newRedis(t)) }

// newRedis returns a store on the Redis at GUARDRAIL_TEST_REDIS_ADDR, its
// keys under a prefix of the test's own, deleted when the test ends.
func newRedis(tb testing.TB) idempotency.Store {
	addr := os.Getenv("GUARDRAIL_TEST_REDIS_ADDR")
	if addr == "" {
		tb.Skip("GUARDRAIL_TEST_REDIS_ADDR is not set (host:port of a Redis server to test against)")
	}
	client := redis.NewClient(&redis.Options{Addr: addr})
	if err := client.Ping(context.Background()).Err(); err != nil {
		client.Close()
		tb.Fatalf("Redis at %s: %v", addr, err)
	}
	prefix := "guardrail-integration:" + idempotency.NewToken()[:12] + ":"
	tb.Cleanup(func() {
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 100).Iterator()
		for iter.Next(ctx) {
			client.Del(ctx, iter.Val())
		}
		client.Close()
	})
	s, err := redisstore.New(client, redisstore.Config{Prefix: prefix})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

func TestLostAnswersChargeOnceRedisCluster(t *testing.T) { testLostAnswers(t, newCluster(t)) }

func TestPanicAfterChargeRedisCluster(t *testing.T) { testPanicAfterCharge(t, newCluster(t)) }

func TestLostAnswersChargeOncePostgres(t *testing.T) { testLostAnswers(t, newPostgres(t)) }

func TestPanicAfterChargePostgres(t *testing.T) { testPanicAfterCharge(t, newPostgres(t)) }

// newPostgres returns a store on the PostgreSQL at
// GUARDRAIL_TEST_POSTGRES_DSN, in a table of the test's own, dropped when
// the test ends.
func newPostgres(tb testing.TB) idempotency.Store {
	dsn := os.Getenv("GUARDRAIL_TEST_POSTGRES_DSN")
	if dsn == "" {
		tb.Skip("GUARDRAIL_TEST_POSTGRES_DSN is not set (a PostgreSQL connection string to test against)")
	}
	pool, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		tb.Fatal(err)
	}
	table := "guardrail_integration_" + idempotency.NewToken()[:12]
	tb.Cleanup(func() {
		pool.Exec(context.Background(), "DROP TABLE IF EXISTS "+table)
		pool.Close()
	})
	s, err := pgstore.New(pool, pgstore.Config{Table: table})
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return s
}
