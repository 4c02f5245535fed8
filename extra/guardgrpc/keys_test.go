package guardgrpc_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

// lossy is a server interceptor, outermost, that loses the answer of the
// first call after the handler (and the key's commit) ran: the client sees
// UNAVAILABLE, as when a connection is cut on the way back.
func lossy() grpc.UnaryServerInterceptor {
	var n atomic.Int64
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if n.Add(1) == 1 {
			return nil, status.Error(codes.Unavailable, "answer lost on the way back")
		}
		return resp, err
	}
}

// charging is a Health service whose Check "charges" once per run.
func charging() *health {
	h := &health{}
	h.check = func(_ context.Context, _ int64, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	return h
}

func keyServer(t testing.TB, store idempotency.Store, h *health, extra ...grpc.UnaryServerInterceptor) healthpb.HealthClient {
	t.Helper()
	return keyServerCfg(t, guardgrpc.KeyConfig{Store: store, SingleTenant: true}, h, extra...)
}

// keyServerCfg serves h behind the extra interceptors (outermost first)
// and a guardgrpc Server with keys, and returns a guarded client of it.
func keyServerCfg(t testing.TB, kc guardgrpc.KeyConfig, h *health, extra ...grpc.UnaryServerInterceptor) healthpb.HealthClient {
	t.Helper()
	if kc.Logger == nil {
		kc.Logger = slog.New(slog.DiscardHandler)
	}
	srv := newServer(t, guardgrpc.ServerConfig{Keys: &kc})
	chain := append(extra, srv.UnaryServerInterceptor())
	return dial(t, serve(t, h, grpc.ChainUnaryInterceptor(chain...)), newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{MaxRetryAfter: -1}}))
}

func withKey(t testing.TB, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctxTimeout(t, 10*time.Second), guardgrpc.MDIdempotencyKey, key)
}

func testLostAnswerChargesOnce(t *testing.T, store idempotency.Store) {
	h := charging()
	cl := keyServer(t, store, h, lossy())
	var header metadata.MD
	resp, err := cl.Check(withKey(t, "pay-"+strconv.FormatInt(time.Now().UnixNano(), 10)), &healthpb.HealthCheckRequest{Service: "order-1"}, grpc.Header(&header))
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("replayed answer %v, want the stored SERVING", resp)
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want once: the retry must get the stored answer", got)
	}
	if got := header.Get(guardgrpc.MDReplayed); len(got) != 1 || got[0] != "true" {
		t.Fatalf("header %v, want %s: true", header, guardgrpc.MDReplayed)
	}
}

func TestLostAnswerChargesOnceMemstore(t *testing.T) {
	testLostAnswerChargesOnce(t, newMemstore(t))
}

func TestKeyMismatchConflictAndRelease(t *testing.T) {
	store := newMemstore(t)
	t.Run("mismatch", func(t *testing.T) {
		h := charging()
		cl := keyServer(t, store, h)
		if _, err := cl.Check(withKey(t, "m"), &healthpb.HealthCheckRequest{Service: "a"}); err != nil {
			t.Fatal(err)
		}
		_, err := cl.Check(withKey(t, "m"), &healthpb.HealthCheckRequest{Service: "b"})
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("same key, other request: %v, want FAILED_PRECONDITION", err)
		}
		if got := h.calls.Load(); got != 1 {
			t.Fatalf("handler ran %d times, want 1", got)
		}
	})
	t.Run("conflict", func(t *testing.T) {
		gate := make(chan struct{})
		in := make(chan struct{})
		h := &health{check: func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
			close(in)
			<-gate
			return serving, nil
		}}
		cl := keyServer(t, store, h)
		done := make(chan error)
		go func() {
			_, err := cl.Check(withKey(t, "c"), &healthpb.HealthCheckRequest{})
			done <- err
		}()
		<-in
		var trailer metadata.MD
		_, err := cl.Check(withKey(t, "c"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		close(gate)
		if status.Code(err) != codes.Aborted || len(trailer.Get(guardgrpc.MDPushback)) != 1 {
			t.Fatalf("same key in flight: %v, trailer %v; want ABORTED with a pushback", err, trailer)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("server error releases, client error is stored", func(t *testing.T) {
		h := &health{check: func(_ context.Context, n int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
			if n == 1 {
				return nil, status.Error(codes.Internal, "bug")
			}
			return nil, status.Error(codes.NotFound, "no such service")
		}}
		cl := keyServer(t, store, h)
		for i, want := range []codes.Code{codes.Internal, codes.NotFound, codes.NotFound} {
			_, err := cl.Check(withKey(t, "r"), &healthpb.HealthCheckRequest{})
			if status.Code(err) != want {
				t.Fatalf("call %d: %v, want %v", i+1, err, want)
			}
		}
		if got := h.calls.Load(); got != 2 {
			t.Fatalf("handler ran %d times, want 2: INTERNAL releases, NOT_FOUND is replayed", got)
		}
	})
	t.Run("malformed key", func(t *testing.T) {
		cl := keyServer(t, store, charging())
		_, err := cl.Check(withKey(t, "a,b"), &healthpb.HealthCheckRequest{})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("malformed key: %v, want INVALID_ARGUMENT", err)
		}
	})
}

// failingStore fails every call.
type failingStore struct{ idempotency.Store }

func (failingStore) Begin(context.Context, string, idempotency.Fingerprint, time.Duration) (idempotency.Result, error) {
	return idempotency.Result{}, errors.New("store down")
}

func TestKeyStoreFailure(t *testing.T) {
	h := charging()
	cl := keyServer(t, failingStore{}, h)
	var trailer metadata.MD
	_, err := cl.Check(withKey(t, "s"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable || len(trailer.Get(guardgrpc.MDPushback)) != 1 {
		t.Fatalf("store down: %v, trailer %v; want UNAVAILABLE with a pushback", err, trailer)
	}
	if h.calls.Load() != 0 {
		t.Fatal("handler ran unprotected without FailOpen")
	}
}

func newMemstore(t testing.TB) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestLeaseRenewedWhileHandlerRuns(t *testing.T) {
	// Renewed every third of the lease: a renewal may be late by two thirds
	// (667 ms) before the lock lapses, which a busy machine under the race
	// detector needs; 60 and 300 ms lapsed there.
	const lease = time.Second
	gate := make(chan struct{})
	in := make(chan struct{}, 1)
	h := &health{check: func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		in <- struct{}{}
		<-gate
		return serving, nil
	}}
	srv := newServer(t, guardgrpc.ServerConfig{MaxTimeout: -1, Keys: &guardgrpc.KeyConfig{Store: newMemstore(t), SingleTenant: true, Lease: lease, Logger: slog.New(slog.DiscardHandler)}})
	cl := dial(t, serve(t, h, grpc.UnaryInterceptor(srv.UnaryServerInterceptor())), nil)
	done := make(chan error)
	go func() {
		// No deadline: the lease alone protects the key.
		_, err := cl.Check(metadata.AppendToOutgoingContext(context.Background(), guardgrpc.MDIdempotencyKey, "slow"), &healthpb.HealthCheckRequest{})
		done <- err
	}()
	<-in
	time.Sleep(2 * lease) // leases pass while the handler runs
	_, err := cl.Check(metadata.AppendToOutgoingContext(ctxTimeout(t, 5*time.Second), guardgrpc.MDIdempotencyKey, "slow"), &healthpb.HealthCheckRequest{})
	close(gate)
	if status.Code(err) != codes.Aborted {
		t.Fatalf("same key after %v of a running handler: %v, want ABORTED (the lease is renewed)", 2*lease, err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
}
