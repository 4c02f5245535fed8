package guardgrpc_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/throttle"
)

// seeded returns reproducible uniform draws, safe for concurrent use.
func seeded() func() float64 {
	var mu sync.Mutex
	r := rand.New(rand.NewPCG(1, 2))
	return func() float64 {
		mu.Lock()
		defer mu.Unlock()
		return r.Float64()
	}
}

func newThrottler(t *testing.T) *throttle.Throttler {
	t.Helper()
	th, err := throttle.New(throttle.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return th
}

// throttledClient is a client with a throttle of the defaults (2 min, K
// = 2), no retries and no breaker, so that only the throttle decides
// what is sent.
func throttledClient(t *testing.T, th *throttle.Throttler, obs event.Observer) guardgrpc.ClientConfig {
	return guardgrpc.ClientConfig{Throttler: th, Retry: guardrail.Retry{
		MaxAttempts: 1,
	},
		Rand: seeded(), Observer: obs,
		Breakers: newGroup(t, breaker.Config{Mode: breaker.Disabled})}
}

func TestThrottleRejectsLocallyWhenServerRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		answer func(ctx context.Context) error
	}{
		{"resource exhausted", func(context.Context) error { return status.Error(codes.ResourceExhausted, "overloaded") }},
		{"unavailable with pushback", func(ctx context.Context) error {
			grpc.SetTrailer(ctx, metadata.Pairs(guardgrpc.MDPushback, "-1"))
			return status.Error(codes.Unavailable, "shed")
		}},
		{"deadline exceeded", func(context.Context) error { return status.Error(codes.DeadlineExceeded, "too slow") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &health{check: func(ctx context.Context, _ int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
				return nil, tc.answer(ctx)
			}}
			th := newThrottler(t)
			obs := &events{}
			cl := dial(t, serve(t, h), newClient(t, throttledClient(t, th, obs)))
			ctx := ctxTimeout(t, 60*time.Second)
			const calls = 300
			throttled := 0
			for range calls {
				_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
				if !errors.Is(err, guardrail.ErrThrottled) {
					continue
				}
				throttled++
				if status.Code(err) != codes.ResourceExhausted {
					t.Fatalf("a throttled call carries %v, want RESOURCE_EXHAUSTED", status.Code(err))
				}
				if msg := status.Convert(err).Message(); !strings.Contains(msg, "client-side throttling") {
					t.Fatalf("a throttled call's message is %q, want it to say client-side throttling", msg)
				}
			}
			// With no accept at all, a request goes through with
			// probability 1/(n+1): about ln(300), 6 of 300.
			sent := h.calls.Load()
			t.Logf("%d of %d calls sent, %d throttled", sent, calls, throttled)
			if sent > 30 || throttled < calls-30 || int64(throttled)+sent != calls {
				t.Fatalf("server saw %d calls and %d were throttled, of %d; want at most 30 sent", sent, throttled, calls)
			}
			ev := obs.of(event.Throttled)
			if len(ev) != throttled {
				t.Fatalf("%d throttled events, want %d", len(ev), throttled)
			}
			for _, e := range ev {
				if e.Operation != checkMethod || e.Reason != event.ReasonThrottled {
					t.Fatalf("throttled event %+v, want one naming %s, for %q", e, checkMethod, event.ReasonThrottled)
				}
			}
		})
	}
}

func TestThrottleCountsAttemptTimeoutsAsRefusals(t *testing.T) {
	h := &health{check: func(ctx context.Context, _ int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}}
	th := newThrottler(t)
	cfg := throttledClient(t, th, nil)
	cfg.AttemptTimeout = 5 * time.Millisecond
	cfg.IdempotentMethods = []string{checkMethod}
	cl := dial(t, serve(t, h), newClient(t, cfg))
	ctx := ctxTimeout(t, 60*time.Second)
	const calls = 100
	for range calls {
		cl.Check(ctx, &healthpb.HealthCheckRequest{})
	}
	if sent := h.calls.Load(); sent > 20 {
		t.Fatalf("server saw %d of %d calls, want at most 20: timeouts are not accepts", sent, calls)
	}
}

func TestThrottleKeepsSendingApplicationErrors(t *testing.T) {
	for _, code := range []codes.Code{codes.NotFound, codes.InvalidArgument, codes.Internal, codes.Unavailable} {
		t.Run(code.String(), func(t *testing.T) {
			h := &health{check: failFirst(1<<40, code)}
			th := newThrottler(t)
			cl := dial(t, serve(t, h), newClient(t, throttledClient(t, th, nil)))
			ctx := ctxTimeout(t, 60*time.Second)
			const calls = 200
			for range calls {
				if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != code || errors.Is(err, guardrail.ErrThrottled) {
					t.Fatalf("Check: %v, want the server's %v", err, code)
				}
			}
			if got := h.calls.Load(); got != calls {
				t.Fatalf("server saw %d of %d calls: answers the server did the work for are accepts", got, calls)
			}
			if req, acc := th.Counts(); req != calls || acc != calls {
				t.Fatalf("throttle counts %d requests, %d accepts; want %d of each", req, acc, calls)
			}
		})
	}
}

func TestThrottleDoesNotApplyToStreams(t *testing.T) {
	h := &health{watch: func(int64, *healthpb.HealthCheckRequest, healthpb.Health_WatchServer) error {
		return status.Error(codes.ResourceExhausted, "overloaded")
	}}
	th := newThrottler(t)
	for range 10 {
		th.Record(time.Now(), false) // a dependency that refused everything
	}
	cl := dial(t, serve(t, h), newClient(t, throttledClient(t, th, nil)))
	ctx := ctxTimeout(t, 60*time.Second)
	for range 5 {
		st, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatalf("Watch: %v, want the stream opened", err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("Recv: %v, want the server's RESOURCE_EXHAUSTED", err)
		}
	}
	if got := h.calls.Load(); got != 5 {
		t.Fatalf("server saw %d of 5 streams", got)
	}
	if req, _ := th.Counts(); req != 10 {
		t.Fatalf("throttle counts %d requests, want the 10 recorded: streams are not counted", req)
	}
}

func TestThrottledRetryIsResourceExhausted(t *testing.T) {
	// The first attempt is let through and answered UNAVAILABLE with a
	// pushback; the retry is throttled. The call ends RESOURCE_EXHAUSTED,
	// not with the UNAVAILABLE callers upstream would retry.
	h := &health{check: pushbackAfter(1<<40, codes.Unavailable, "1")}
	th := newThrottler(t)
	for range 50 {
		th.Record(time.Now(), false)
	}
	var draws atomic.Int64
	cfg := throttledClient(t, th, nil)
	cfg.MaxAttempts = 3
	cfg.IdempotentMethods = []string{checkMethod}
	cfg.Rand = func() float64 {
		if draws.Add(1) == 1 {
			return 0.999 // above the rejection probability of 50/51
		}
		return 0
	}
	cl := dial(t, serve(t, h), newClient(t, cfg))
	_, err := cl.Check(ctxTimeout(t, 60*time.Second), &healthpb.HealthCheckRequest{})
	var ge *guardrail.Error
	if !errors.Is(err, guardrail.ErrThrottled) || !errors.As(err, &ge) || ge.Attempts != 1 {
		t.Fatalf("err = %v, want ErrThrottled after 1 attempt", err)
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("code %v, want RESOURCE_EXHAUSTED", status.Code(err))
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("server saw %d calls, want 1", got)
	}
}
