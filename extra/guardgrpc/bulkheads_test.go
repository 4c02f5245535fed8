package guardgrpc_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

// Two Clients given one bulkhead.Group share its compartments: the calls
// of the first count against the second, as they do for a Client that
// replaces another on a configuration reload.
func TestSharedBulkheadsCountEveryClientsCalls(t *testing.T) {
	gate := make(chan struct{})
	in := make(chan struct{}, 4)
	h := &health{check: func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		in <- struct{}{}
		<-gate
		return serving, nil
	}}
	addr := serve(t, h)
	group, err := bulkhead.NewGroup(bulkhead.GroupConfig{Config: bulkheadCfg})
	if err != nil {
		t.Fatal(err)
	}
	first := newClient(t, guardgrpc.ClientConfig{Bulkheads: group})
	second := newClient(t, guardgrpc.ClientConfig{Bulkheads: group, Retry: guardrail.Retry{MaxAttempts: 1}})
	if first.Bulkheads() != group || second.Bulkheads() != group {
		t.Fatal("Bulkheads() is not the group the Clients were given")
	}
	old, cur := dial(t, addr, first), dial(t, addr, second)
	ctx := ctxTimeout(t, 10*time.Second)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { old.Check(ctx, &healthpb.HealthCheckRequest{}) })
	}
	<-in
	<-in
	_, err = cur.Check(ctx, &healthpb.HealthCheckRequest{})
	close(gate)
	wg.Wait()
	if !errors.Is(err, guardrail.ErrBulkheadFull) || status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a third call through the second Client: %v; want ErrBulkheadFull with RESOURCE_EXHAUSTED, the first Client's two calls filling the shared compartment", err)
	}
	if got := h.calls.Load(); got != 2 {
		t.Errorf("the server saw %d calls; want 2", got)
	}
}

func TestNewClientRejectsBulkheadAndBulkheads(t *testing.T) {
	group, err := bulkhead.NewGroup(bulkhead.GroupConfig{Config: bulkheadCfg})
	if err != nil {
		t.Fatal(err)
	}
	_, err = guardgrpc.NewClient(guardgrpc.ClientConfig{Bulkhead: &bulkheadCfg, Bulkheads: group})
	if !errors.Is(err, guardgrpc.ErrInvalidConfig) {
		t.Errorf("NewClient with both Bulkhead and Bulkheads = %v; want ErrInvalidConfig", err)
	}
}
