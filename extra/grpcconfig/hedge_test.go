package grpcconfig_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/extra/config"
	"github.com/guardrail-go/guardrail/extra/grpcconfig"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/throttle"
)

const hedgeFile = `
defaults:
  backoff: {strategy: none}
dependencies:
  health:
    kind: grpc
    reason: "tests"
    idempotent_methods: [/grpc.health.v1.Health/Check]
    hedge: {delay: 20ms}
  throttled:
    kind: grpc
    reason: "tests"
    max_attempts: 1
    attempt_timeout: 2s
    breaker: {mode: disabled}  # the test counts what the throttle does alone
    throttle: {window: 1h}
`

// byCall is a Health service that names each call by its request's
// Service field: the first attempt of a call hangs until the client gives
// it up, the others answer at once; a call named fail is refused for
// overload.
type byCall struct {
	healthpb.UnimplementedHealthServer
	calls atomic.Int64
	seen  sync.Map
}

func (h *byCall) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.calls.Add(1)
	switch name := req.GetService(); {
	case name == "fail":
		return nil, status.Error(codes.ResourceExhausted, "overloaded")
	case strings.HasPrefix(name, "hang"):
		if _, again := h.seen.LoadOrStore(name, true); !again {
			<-ctx.Done()
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	return serving, nil
}

// A hedged gRPC client from the file is the one built by hand from the
// same numbers: the same ClientConfig, and against a server whose first
// attempt of each call hangs, the same calls seen, every call answered by
// its hedge.
func TestHedgeEqualsHandBuilt(t *testing.T) {
	reg := newRegistry(t, hedgeFile)
	fromFile, err := grpcconfig.NewClient(reg, "health", grpcconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, _ := fromFile.Config()
	hand := guardgrpc.ClientConfig{Name: "health", Retry: guardrail.Retry{
		Backoff: backoff.None(),
	},
		IdempotentMethods: []string{checkMethod},
		Hedge:             &guardrail.HedgeConfig{Delay: 20 * time.Millisecond}}
	plain := got
	plain.Budget, plain.Breakers = nil, nil
	if !reflect.DeepEqual(plain, hand) {
		t.Errorf("the file's ClientConfig\n%+v\nis not the one built by hand\n%+v", plain, hand)
	}
	byHand, err := guardgrpc.NewClient(hand)
	if err != nil {
		t.Fatal(err)
	}
	h := &byCall{}
	addr := serve(t, h)
	const calls = 4 // hedges spend budget tokens: 4 leave the default budget above half
	for name, cl := range map[string]healthpb.HealthClient{
		"file": dial(t, addr, fromFile.DialOptions()),
		"hand": dial(t, addr, byHand.DialOptions()),
	} {
		h.calls.Store(0)
		for i := range calls {
			resp, err := cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{Service: fmt.Sprintf("hang-%s-%d", name, i)})
			if err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
				t.Fatalf("%s client, call %d: %v, %v; want the hedge's answer", name, i, resp, err)
			}
		}
		if n := h.calls.Load(); n != 2*calls {
			t.Errorf("the %s client sent %d calls for %d; want %d, a first attempt and a hedge each", name, n, calls, 2*calls)
		}
	}
}

// A gRPC dependency's throttler is the Registry's: every Client of the
// dependency shares it, and it survives the reloads that leave its
// settings alone, under concurrent callers, counting every attempt of
// every client. New settings make a fresh one.
func TestThrottlerSurvivesReload(t *testing.T) {
	reg := newRegistry(t, hedgeFile)
	handle, _ := reg.GRPC("throttled")
	th := handle.Current().Throttler
	if th == nil {
		t.Fatal("the throttle section built no Throttler")
	}
	h := &byCall{}
	addr := serve(t, h)
	var clients []healthpb.HealthClient
	for range 2 {
		c, err := grpcconfig.NewClient(reg, "throttled", grpcconfig.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if cfg, _ := c.Config(); cfg.Throttler != th {
			t.Fatal("a Client's ClientConfig has a throttler of its own; want the Registry's")
		}
		clients = append(clients, dial(t, addr, c.DialOptions()))
	}
	var oks, throttled atomic.Int64
	ctx := ctxTimeout(t, time.Minute)
	call := func(cl healthpb.HealthClient, fail bool) {
		name := ""
		if fail {
			name = "fail"
		}
		_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{Service: name})
		switch {
		case err == nil:
			oks.Add(1)
		case errors.Is(err, guardrail.ErrThrottled):
			throttled.Add(1)
		case status.Code(err) != codes.ResourceExhausted:
			t.Error(err)
		}
	}
	// One call alone first: calls racing with the set-up of the
	// throttler's first bucket may go uncounted (its counts are
	// approximate by so much), which this test, counting exactly, must not
	// meet.
	call(clients[0], false)

	const callers, calls = 8, 40
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range callers {
		wg.Go(func() {
			<-start
			for j := range calls {
				call(clients[i%2], (i+j)%3 != 0)
			}
		})
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	close(start)
	reloads := 0
	for done := false; !done || reloads < 10; reloads++ {
		select {
		case <-finished:
			done = true
		default:
		}
		data := strings.Replace(hedgeFile, "attempt_timeout: 2s", fmt.Sprintf("attempt_timeout: %ds", 2+reloads%2), 1)
		if err := reg.ReloadBytes([]byte(data)); err != nil {
			t.Fatal(err)
		}
		if handle.Current().Throttler != th {
			t.Fatalf("reload %d replaced the throttler, whose settings did not change", reloads)
		}
	}
	wg.Wait()
	req, acc := th.Counts()
	if want := h.calls.Load() + throttled.Load(); req != want {
		t.Errorf("the throttler counts %d requests; want %d (%d sent, %d rejected) across %d reloads", req, want, h.calls.Load(), throttled.Load(), reloads)
	}
	if acc != oks.Load() {
		t.Errorf("the throttler counts %d accepts; want %d, the answers that were not refusals", acc, oks.Load())
	}
	if throttled.Load() == 0 {
		t.Error("no call was throttled with two in three refused; want some")
	}
	t.Logf("%d calls, %d sent, %d throttled, %d reloads", 1+callers*calls, h.calls.Load(), throttled.Load(), reloads)

	// New settings: a fresh throttler, which every Client uses from its
	// next call on.
	if err := reg.ReloadBytes([]byte(strings.Replace(hedgeFile, "throttle: {window: 1h}", "throttle: {window: 1h, k: 3}", 1))); err != nil {
		t.Fatal(err)
	}
	nth := handle.Current().Throttler
	if nth == th {
		t.Fatal("a reload of k kept the old throttler")
	}
	call(clients[1], false)
	if r, a := nth.Counts(); r != 1 || a != 1 {
		t.Errorf("the new throttler counts %d requests, %d accepts after one call; want 1, 1", r, a)
	}
	if r, _ := th.Counts(); r != req {
		t.Errorf("the old throttler counted a call after the reload: %d requests; want %d", r, req)
	}
}

// Settings that are not a Registry's, built by hand, may have a throttle
// configuration and no Throttler, a bulkhead configuration and no group:
// ClientConfig builds a throttler, and hands guardgrpc the bulkhead
// configuration. The Hedge it returns is a copy.
func TestClientConfigOfHandBuiltSettings(t *testing.T) {
	s := &config.GRPCSettings{Name: "health", Throttle: &throttle.Config{K: 2},
		Bulkhead: &bulkhead.Config{MaxConcurrent: 4}, Hedge: &guardrail.HedgeConfig{Delay: 20 * time.Millisecond}}
	cfg := grpcconfig.ClientConfig(s, grpcconfig.Options{})
	if cfg.Throttler == nil || cfg.Bulkhead == nil || cfg.Bulkhead == s.Bulkhead || cfg.Bulkhead.MaxConcurrent != 4 {
		t.Errorf("Throttler %v, Bulkhead %+v; want a throttler, a copy of the bulkhead configuration", cfg.Throttler, cfg.Bulkhead)
	}
	if !reflect.DeepEqual(cfg.Hedge, s.Hedge) {
		t.Errorf("Hedge %+v; want %+v", cfg.Hedge, s.Hedge)
	}
	cfg.Hedge.Delay = time.Hour
	if s.Hedge.Delay != 20*time.Millisecond {
		t.Error("a change to the ClientConfig's Hedge reached the settings it came from")
	}
	if _, err := guardgrpc.NewClient(cfg); err != nil {
		t.Errorf("the ClientConfig does not build: %v", err)
	}
}
