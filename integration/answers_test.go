package integration

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/idempotency"
)

// scripted is a Health service that answers its first call with first,
// and every later one with SERVING. calls counts the calls that reached it.
type scripted struct {
	healthpb.UnimplementedHealthServer
	first *status.Status
	calls atomic.Int64
}

func (s *scripted) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if s.calls.Add(1) == 1 && s.first != nil {
		if s.first.Code() == codes.ResourceExhausted {
			grpc.SetTrailer(ctx, metadata.Pairs(guardgrpc.MDPushback, "2000"))
		}
		return nil, s.first.Err()
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// plain serves svc behind a guardgrpc Server with keys in store, and
// returns a client of it that never retries: every call is one call.
func plain(t *testing.T, kc guardgrpc.KeyConfig, obs event.Observer, svc healthpb.HealthServer) healthpb.HealthClient {
	t.Helper()
	kc.SingleTenant = true
	if kc.Logger == nil {
		kc.Logger = slog.New(slog.DiscardHandler)
	}
	srv, err := guardgrpc.NewServer(guardgrpc.ServerConfig{Keys: &kc, Observer: obs})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.UnaryInterceptor(srv.UnaryServerInterceptor()))
	healthpb.RegisterHealthServer(gs, svc)
	done := make(chan struct{})
	go func() { defer close(done); _ = gs.Serve(lis) }()
	t.Cleanup(func() { gs.Stop(); <-done })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// testAnswers is the gRPC half of the table of stored and released
// answers, end to end on store: a definite answer is replayed to the
// retry with the same key without the handler running; one that says the
// call was not processed (RESOURCE_EXHAUSTED with a pushback, UNAVAILABLE,
// ABORTED, INTERNAL) releases the key on the store, so the retry reaches
// the handler, whose success is then stored. The HTTP half runs on every
// store in storetest.RunHTTP.
func testAnswers(t *testing.T, store idempotency.Store) {
	for _, tt := range []struct {
		code   codes.Code
		stored bool
	}{
		{codes.NotFound, true},
		{codes.AlreadyExists, true},
		{codes.FailedPrecondition, true},
		{codes.ResourceExhausted, false},
		{codes.Unavailable, false},
		{codes.Aborted, false},
		{codes.Internal, false},
	} {
		t.Run(tt.code.String(), func(t *testing.T) {
			svc := &scripted{first: status.New(tt.code, "first answer")}
			hc := plain(t, guardgrpc.KeyConfig{Store: store}, nil, svc)
			key := "answers-" + idempotency.NewToken()[:12]
			call := func() (error, bool) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				var header metadata.MD
				_, err := hc.Check(metadata.AppendToOutgoingContext(ctx, guardgrpc.MDIdempotencyKey, key), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
				return err, len(header.Get(idempotency.HeaderReplayed)) == 1
			}
			if err, _ := call(); status.Code(err) != tt.code {
				t.Fatalf("first call: %v, want %v", err, tt.code)
			}
			err, replayed := call()
			switch {
			case tt.stored && (status.Code(err) != tt.code || !replayed):
				t.Errorf("retry: %v (replayed %v), want the stored %v replayed", err, replayed, tt.code)
			case !tt.stored && (err != nil || replayed):
				t.Errorf("retry: %v (replayed %v), want it run and succeed", err, replayed)
			}
			if !tt.stored {
				if err, replayed := call(); err != nil || !replayed {
					t.Errorf("third call: %v (replayed %v), want the stored success replayed", err, replayed)
				}
			}
			want := int64(2)
			if tt.stored {
				want = 1
			}
			if got := svc.calls.Load(); got != want {
				t.Errorf("handler ran %d times, want %d", got, want)
			}
		})
	}
}

// takenOver wraps a store so that every Release finds its lock lost for
// real: just before it, as when a lease ended and a retry took the key
// over, another holder frees the key and locks it again under a token of
// its own, and then the store itself refuses the release (storetest holds
// the HTTP twin).
type takenOver struct {
	idempotency.Store
	takeovers atomic.Int32
}

func (s *takenOver) Release(ctx context.Context, key, token string) error {
	if err := s.Store.Release(ctx, key, token); err != nil {
		return err
	}
	if res, err := s.Store.Begin(ctx, key, idempotency.Fingerprint{9}, time.Minute); err != nil || res.State != idempotency.StateAcquired {
		return err
	}
	s.takeovers.Add(1)
	return s.Store.Release(ctx, key, token) // the old token: the store says ErrLockLost
}

// testLostLockOnRelease: a call whose answer releases its key, but whose
// lock is no longer its own, still gets its answer; the log says so as a
// warning, and nothing is reported as a store failure, as over HTTP.
func testLostLockOnRelease(t *testing.T, store idempotency.Store) {
	wrapped := &takenOver{Store: store}
	var logs lockedBuffer
	var storeErrors atomic.Int32
	obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.Idempotency && e.Reason == event.ReasonStoreError {
			storeErrors.Add(1)
		}
		return ctx
	})
	svc := &scripted{first: status.New(codes.Unavailable, "database down")}
	hc := plain(t, guardgrpc.KeyConfig{Store: wrapped, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, obs, svc)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := hc.Check(metadata.AppendToOutgoingContext(ctx, guardgrpc.MDIdempotencyKey, "lost-"+idempotency.NewToken()[:12]), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "database down" {
		t.Fatalf("answer %v, want the handler's UNAVAILABLE", err)
	}
	if n := wrapped.takeovers.Load(); n != 1 {
		t.Fatalf("%d takeovers, want 1: the release did not reach the store", n)
	}
	if n := storeErrors.Load(); n != 0 {
		t.Errorf("%d store_error events, want none: a lost lock is not a store failure", n)
	}
	if l := logs.String(); !strings.Contains(l, "no longer held when releasing it") || strings.Contains(l, "level=ERROR") {
		t.Errorf("log, want one warning that the key was no longer held:\n%s", l)
	}
}

// lockedBuffer is a log destination safe for concurrent writers.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestAnswersMemstore(t *testing.T)     { testAnswers(t, newMemstore(t)) }
func TestAnswersRedis(t *testing.T)        { testAnswers(t, newRedis(t)) }
func TestAnswersRedisCluster(t *testing.T) { testAnswers(t, newCluster(t)) }
func TestAnswersPostgres(t *testing.T)     { testAnswers(t, newPostgres(t)) }

func TestLostLockOnReleaseMemstore(t *testing.T)     { testLostLockOnRelease(t, newMemstore(t)) }
func TestLostLockOnReleaseRedis(t *testing.T)        { testLostLockOnRelease(t, newRedis(t)) }
func TestLostLockOnReleaseRedisCluster(t *testing.T) { testLostLockOnRelease(t, newCluster(t)) }
func TestLostLockOnReleasePostgres(t *testing.T)     { testLostLockOnRelease(t, newPostgres(t)) }
