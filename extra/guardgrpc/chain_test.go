package guardgrpc_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/shed"
)

// middleTier serves Check by calling next through a guardgrpc client that
// retries 3 times, behind a guardgrpc Server with a chain.Server when
// withChain is set.
func middleTier(t *testing.T, next string, withChain bool, cfg guardgrpc.ServerConfig) (*health, string) {
	t.Helper()
	down := dial(t, next, newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{MaxAttempts: 3}, IdempotentMethods: []string{checkMethod}}))
	h := &health{check: func(ctx context.Context, _ int64, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		return down.Check(ctx, req)
	}}
	if withChain {
		cs, err := chain.New(chain.Config{})
		if err != nil {
			t.Fatal(err)
		}
		cfg.Chain = cs
	}
	return h, serve(t, h, newServer(t, cfg).ServerOptions()...)
}

// Over gRPC as over HTTP: with the chain's trailers only the tier next to
// the failure retries, and the marker reaches the user's client.
func TestChainAlreadyRetriedGRPC(t *testing.T) {
	for _, tc := range []struct {
		name                 string
		withChain            bool
		wantMiddle, wantBase int64
	}{
		{"markers", true, 1, 3},
		{"no markers", false, 3, 9},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bottom := &health{check: func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
				return nil, status.Error(codes.Unavailable, "down")
			}}
			baseAddr := serve(t, bottom)
			middle, midAddr := middleTier(t, baseAddr, tc.withChain, guardgrpc.ServerConfig{})
			top, topAddr := middleTier(t, midAddr, tc.withChain, guardgrpc.ServerConfig{})

			var trailer metadata.MD
			_, err := dial(t, topAddr, nil).Check(ctxTimeout(t, 30*time.Second), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
			if status.Code(err) != codes.Unavailable {
				t.Errorf("code %v, want UNAVAILABLE", status.Code(err))
			}
			if got := len(trailer[chain.MDRetried]) > 0; got != tc.withChain {
				t.Errorf("trailer %v: marker present %v, want %v", trailer, got, tc.withChain)
			}
			if got := top.calls.Load(); got != 1 {
				t.Errorf("top saw %d calls, want 1", got)
			}
			if got := middle.calls.Load(); got != tc.wantMiddle {
				t.Errorf("middle saw %d calls, want %d", got, tc.wantMiddle)
			}
			if got := bottom.calls.Load(); got != tc.wantBase {
				t.Errorf("bottom saw %d calls, want %d", got, tc.wantBase)
			}
		})
	}
}

// A shed call carries x-not-processed, and a guardgrpc client retries it
// even for a method that is not idempotent; the amplification rises with
// each attempt and reaches the server as metadata.
func TestChainNotProcessedGRPC(t *testing.T) {
	shedOnce := make(chan struct{})
	var once sync.Once
	sh, err := shed.New(shed.Config{Limit: 1, Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.Shed {
			once.Do(func() { close(shedOnce) })
		}
		return ctx
	})})
	if err != nil {
		t.Fatal(err)
	}
	cs, _ := chain.New(chain.Config{})
	var mu sync.Mutex
	var amps []string
	first := make(chan struct{})
	hold := make(chan struct{})
	h := &health{check: func(ctx context.Context, n int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		mu.Lock()
		amps = append(amps, md.Get(chain.MDAmplification)...)
		mu.Unlock()
		if n == 1 {
			close(first)
			<-hold
		}
		return serving, nil
	}}
	addr := serve(t, h, newServer(t, guardgrpc.ServerConfig{Shedder: sh, ShedPushback: 250 * time.Millisecond, Chain: cs}).ServerOptions()...)
	// Not idempotent: without the marker the shed call would be final.
	client := dial(t, addr, newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{MaxAttempts: 5}}))

	done := make(chan error, 1)
	go func() {
		_, err := client.Check(ctxTimeout(t, 30*time.Second), &healthpb.HealthCheckRequest{})
		done <- err
	}()
	<-first
	// The slot is held: this call is shed, then retried once it frees.
	second := make(chan error, 1)
	go func() {
		_, err := client.Check(ctxTimeout(t, 30*time.Second), &healthpb.HealthCheckRequest{})
		second <- err
	}()
	<-shedOnce // then free the slot
	close(hold)
	if err := <-done; err != nil {
		t.Fatalf("first call: %v", err)
	}
	if err := <-second; err != nil {
		t.Fatalf("the shed call was not retried to success: %v", err)
	}
	if got := h.calls.Load(); got != 2 {
		t.Errorf("the handler ran %d times, want 2", got)
	}
	mu.Lock()
	defer mu.Unlock()
	// The first call's attempt is 1 (no metadata); the retried call's
	// second attempt stands for 2 sends of its user's request.
	if len(amps) != 1 || amps[0] != "2" {
		t.Errorf("amplification metadata %q, want [2]", amps)
	}
}

// A server's admission level reaches the client in the trailer, and a call
// of a lower cohort is refused before its handler, marked not processed.
func TestChainAdmissionGRPC(t *testing.T) {
	cs, _ := chain.New(chain.Config{Admission: func() int { return 50 }})
	h := &health{}
	addr := serve(t, h, newServer(t, guardgrpc.ServerConfig{Chain: cs}).ServerOptions()...)
	client := newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{MaxAttempts: 1}})
	hc := dial(t, addr, client)

	call := func(cohort int) (metadata.MD, error) {
		st := chain.NewState(1, 0)
		st.SetCohort(cohort)
		var tr metadata.MD
		_, err := hc.Check(chain.NewContext(ctxTimeout(t, 30*time.Second), st), &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr))
		return tr, err
	}
	tr, err := call(80)
	if err != nil {
		t.Fatalf("cohort 80 above the level: %v", err)
	}
	if got := tr.Get(chain.MDAdmission); len(got) != 1 || got[0] != "50" {
		t.Errorf("trailer %v: want %s 50", tr, chain.MDAdmission)
	}
	if got := client.AdmissionLevel(); got != 50 {
		t.Errorf("client's level %d, want 50", got)
	}
	tr, err = call(10)
	if status.Code(err) != codes.Unavailable || len(tr.Get(chain.MDNotProcessed)) != 1 {
		t.Errorf("cohort 10 below the level: %v, trailer %v; want UNAVAILABLE, not processed", err, tr)
	}
	if got := h.calls.Load(); got != 1 {
		t.Errorf("the handler ran %d times, want 1: the refused call never reached it", got)
	}
}
