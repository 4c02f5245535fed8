package guardgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/idempotency"
)

func TestKeysRequireAScope(t *testing.T) {
	_, err := guardgrpc.NewServer(guardgrpc.ServerConfig{Keys: &guardgrpc.KeyConfig{Store: newMemstore(t)}})
	if !errors.Is(err, guardgrpc.ErrInvalidConfig) || !strings.Contains(err.Error(), "KeyConfig.Scope is nil and KeyConfig.SingleTenant is false") {
		t.Fatalf("NewServer without a scope: %v, want ErrInvalidConfig naming Scope and SingleTenant", err)
	}
	_, err = guardgrpc.NewServer(guardgrpc.ServerConfig{Keys: &guardgrpc.KeyConfig{
		Store: newMemstore(t), SingleTenant: true,
		Scope: func(context.Context) (string, error) { return "a", nil },
	}})
	if !errors.Is(err, guardgrpc.ErrInvalidConfig) || !strings.Contains(err.Error(), "KeyConfig.Scope is set and KeyConfig.SingleTenant is true") {
		t.Fatalf("NewServer with both Scope and SingleTenant: %v, want ErrInvalidConfig naming both", err)
	}
}

// tenantScope scopes keys by the "tenant" metadata entry, as an
// authentication interceptor's result would be read.
func tenantScope(ctx context.Context) (string, error) {
	v := metadata.ValueFromIncomingContext(ctx, "tenant")
	if len(v) != 1 {
		return "", errors.New("no tenant")
	}
	return v[0], nil
}

func TestKeyScope(t *testing.T) {
	store := newMemstore(t)
	h := charging()
	cl := keyServerCfg(t, guardgrpc.KeyConfig{Store: store, Scope: tenantScope}, h)
	call := func(tenant string) error {
		ctx := withKey(t, "k")
		if tenant != "-" {
			ctx = metadata.AppendToOutgoingContext(ctx, "tenant", tenant)
		}
		_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	for _, tenant := range []string{"-", ""} {
		if err := call(tenant); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("tenant %q: %v, want PERMISSION_DENIED", tenant, err)
		}
	}
	if got := h.calls.Load(); got != 0 {
		t.Fatalf("handler ran %d times for calls Scope refused, want 0", got)
	}
	for _, tenant := range []string{"a", "b", "a"} {
		if err := call(tenant); err != nil {
			t.Fatalf("tenant %s: %v", tenant, err)
		}
	}
	if got := h.calls.Load(); got != 2 {
		t.Fatalf("handler ran %d times for tenants a, b, a with one key, want 2: each tenant has its own keys", got)
	}
	// A call without a key is not attributed: Scope is not asked.
	if _, err := cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("call without a key or tenant: %v", err)
	}
}

// recovering is the outermost interceptor of a server whose handlers may
// panic: it turns the panic into UNAVAILABLE, as a client sees a server
// that died mid-call, so the guarded client retries. panics counts them.
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

func TestPanicAfterChargeIsAnUnknownOutcome(t *testing.T) {
	var panics atomic.Int64
	h := &health{check: func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		// charged: the side effect is committed, then the handler fails
		panic("after the charge")
	}}
	cl := keyServer(t, newMemstore(t), h, recovering(&panics))
	var header metadata.MD
	_, err := cl.Check(withKey(t, "p"), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	if status.Code(err) != codes.Internal || !strings.Contains(status.Convert(err).Message(), "outcome unknown for this idempotency-key") {
		t.Fatalf("retry after a panic: %v, want INTERNAL outcome unknown", err)
	}
	if got := header.Get(idempotency.HeaderReplayed); len(got) != 1 || got[0] != "true" {
		t.Fatalf("header %v, want %s: true", header, idempotency.HeaderReplayed)
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("handler ran (charged) %d times, want once: a panic must not release the key", got)
	}
	if got := panics.Load(); got != 1 {
		t.Fatalf("%d panics reached the recovering interceptor, want 1: the panic is re-raised", got)
	}
	// Later retries get the same answer, still without the handler.
	_, err = cl.Check(withKey(t, "p"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Internal || h.calls.Load() != 1 {
		t.Fatalf("second retry: %v after %d runs, want INTERNAL after 1", err, h.calls.Load())
	}
}

func TestReleaseBeforePanicLetsTheRetryRun(t *testing.T) {
	var panics atomic.Int64
	h := &health{check: func(ctx context.Context, n int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if n == 1 {
			if err := idempotency.Release(ctx); err != nil {
				t.Errorf("idempotency.Release: %v", err)
			}
			panic("nothing committed")
		}
		return serving, nil
	}}
	cl := keyServer(t, newMemstore(t), h, recovering(&panics))
	var header metadata.MD
	resp, err := cl.Check(withKey(t, "r"), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("retry after a released panic: %v, %v; want SERVING", resp, err)
	}
	if got := header.Get(idempotency.HeaderReplayed); len(got) != 0 {
		t.Fatalf("header %v: the retry ran, it must not be marked replayed", header)
	}
	if got, p := h.calls.Load(), panics.Load(); got != 2 || p != 1 {
		t.Fatalf("handler ran %d times with %d panics, want 2 and 1", got, p)
	}
}

func TestReleaseOnASuccessReleases(t *testing.T) {
	var handlerCtx context.Context
	h := &health{check: func(ctx context.Context, n int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		handlerCtx = ctx
		if err := idempotency.Release(ctx); err != nil {
			t.Errorf("idempotency.Release: %v", err)
		}
		return serving, nil
	}}
	cl := keyServer(t, newMemstore(t), h)
	for range 2 {
		if _, err := cl.Check(withKey(t, "s"), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	if got := h.calls.Load(); got != 2 {
		t.Fatalf("handler ran %d times, want 2: a released key is not stored", got)
	}
	if err := idempotency.Release(handlerCtx); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Fatalf("idempotency.Release after the handler returned: %v, want ErrLeaseLost", err)
	}
	if err := idempotency.Release(context.Background()); !errors.Is(err, idempotency.ErrNoLease) {
		t.Fatalf("idempotency.Release outside a call: %v, want ErrNoLease", err)
	}
}

func TestReleaseUnprotected(t *testing.T) {
	h := &health{check: func(ctx context.Context, _ int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if err := idempotency.Release(ctx); err != nil {
			t.Errorf("idempotency.Release in a call without a key: %v, want nil", err)
		}
		return serving, nil
	}}
	cl := keyServer(t, newMemstore(t), h)
	if _, err := cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
}
