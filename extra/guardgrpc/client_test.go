package guardgrpc_test

import (
	"context"
	"errors"
	"io"
	"net"
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
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/fleet"
)

func failFirst(n int64, code codes.Code) func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return func(_ context.Context, i int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if i <= n {
			return nil, status.Error(code, "scripted")
		}
		return serving, nil
	}
}

func TestUnavailableRetriedForIdempotentMethod(t *testing.T) {
	h := &health{check: failFirst(2, codes.Unavailable)}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}}))
	var attempts []string
	h.check = func(ctx context.Context, i int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		attempts = append(attempts, first(md[guardgrpc.MDRetryAttempt]))
		if i <= 2 {
			return nil, status.Error(codes.Unavailable, "scripted")
		}
		return serving, nil
	}
	if _, err := cl.Check(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got := h.calls.Load(); got != 3 {
		t.Fatalf("server saw %d calls, want 3", got)
	}
	if want := []string{"", "1", "2"}; !equal(attempts, want) {
		t.Fatalf("x-retry-attempt per attempt = %q, want %q", attempts, want)
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestPermanentCodesNeverRetried(t *testing.T) {
	for _, code := range []codes.Code{codes.InvalidArgument, codes.NotFound, codes.PermissionDenied,
		codes.Unauthenticated, codes.FailedPrecondition, codes.AlreadyExists, codes.Internal, codes.Unknown} {
		t.Run(code.String(), func(t *testing.T) {
			h := &health{check: failFirst(100, code)}
			cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}}))
			_, err := cl.Check(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{})
			if status.Code(err) != code {
				t.Fatalf("err = %v, want code %v", err, code)
			}
			if got := h.calls.Load(); got != 1 {
				t.Fatalf("server saw %d calls, want 1", got)
			}
		})
	}
}

func TestNotIdempotentUnavailableAfterSendNotRetried(t *testing.T) {
	h := &health{check: failFirst(100, codes.Unavailable)}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{}))
	_, err := cl.Check(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want UNAVAILABLE", err)
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("server saw %d calls, want 1 (the method is not idempotent and the request was sent)", got)
	}
}

func TestIdempotencyKeyMakesCallRetryable(t *testing.T) {
	h := &health{check: failFirst(1, codes.Unavailable)}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{}))
	ctx := metadata.AppendToOutgoingContext(ctxTimeout(t, 5*time.Second), guardgrpc.MDIdempotencyKey, "k1")
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got := h.calls.Load(); got != 2 {
		t.Fatalf("server saw %d calls, want 2", got)
	}
}

// countAttempts is an Observer counting attempt starts.
type countAttempts struct{ n atomic.Int64 }

func (c *countAttempts) Observe(ctx context.Context, e event.Event) context.Context {
	if e.Kind == event.AttemptStart {
		c.n.Add(1)
	}
	return ctx
}

func TestUnsentRetriedForNonIdempotentMethod(t *testing.T) {
	// Nothing listens: grpc-go fails the call without a transport stream.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	obs := &countAttempts{}
	cl := dial(t, addr, newClient(t, guardgrpc.ClientConfig{Observer: obs, Retry: guardrail.Retry{Budget: budget.Unlimited()}}))
	_, err = cl.Check(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("err = %v, want UNAVAILABLE", err)
	}
	if got := obs.n.Load(); got != 3 {
		t.Fatalf("%d attempts, want 3: a call that never got a stream is safe to repeat", got)
	}
}

func TestDeadlineOfNotIdempotentCallIsOutcomeUnknown(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	h := &health{check: func(ctx context.Context, _ int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		select {
		case <-ctx.Done():
		case <-release:
		}
		return nil, status.FromContextError(ctx.Err()).Err()
	}}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{AttemptTimeout: 100 * time.Millisecond}}))
	_, err := cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	if !errors.Is(err, guardrail.ErrOutcomeUnknown) || status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("err = %v (code %v), want ErrOutcomeUnknown with DEADLINE_EXCEEDED", err, status.Code(err))
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("server saw %d calls, want 1", got)
	}
}

func TestAttemptDeadlineRetriedForIdempotentMethod(t *testing.T) {
	h := &health{}
	h.check = func(ctx context.Context, n int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if n == 1 {
			<-ctx.Done() // the attempt's deadline, sent as grpc-timeout
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return serving, nil
	}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{AttemptTimeout: 100 * time.Millisecond}, IdempotentMethods: []string{"/grpc.health.v1.Health/"}}))
	if _, err := cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got := h.calls.Load(); got != 2 {
		t.Fatalf("server saw %d calls, want 2", got)
	}
}

func TestTooLittleTimeLeftFailsAtOnce(t *testing.T) {
	h := &health{}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{MinAttemptTime: time.Second}}))
	start := time.Now()
	_, err := cl.Check(ctxTimeout(t, 500*time.Millisecond), &healthpb.HealthCheckRequest{})
	if !errors.Is(err, guardrail.ErrDeadline) || status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("err = %v, want ErrDeadline with DEADLINE_EXCEEDED", err)
	}
	if d := time.Since(start); d > 250*time.Millisecond {
		t.Fatalf("took %v, want at once", d)
	}
	if got := h.calls.Load(); got != 0 {
		t.Fatalf("server saw %d calls, want 0", got)
	}
}

func TestDeadlinePropagatedAsGRPCTimeout(t *testing.T) {
	left := make(chan time.Duration, 1)
	h := &health{check: func(ctx context.Context, _ int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		dl, ok := ctx.Deadline()
		if !ok {
			left <- -1
		} else {
			left <- time.Until(dl)
		}
		return serving, nil
	}}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{}))
	if _, err := cl.Check(ctxTimeout(t, 3*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if d := <-left; d <= 2*time.Second || d > 3*time.Second {
		t.Fatalf("server saw %v left, want the caller's 3 s less the trip", d)
	}
	// The attempt timeout is on top: the server sees the shorter bound.
	cl = dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{AttemptTimeout: 800 * time.Millisecond}}))
	if _, err := cl.Check(ctxTimeout(t, 3*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if d := <-left; d <= 300*time.Millisecond || d > 800*time.Millisecond {
		t.Fatalf("server saw %v left, want the attempt's 800 ms less the trip", d)
	}
}

func pushbackAfter(n int64, code codes.Code, pb string) func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return func(ctx context.Context, i int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if i <= n {
			grpc.SetTrailer(ctx, metadata.Pairs(guardgrpc.MDPushback, pb))
			return nil, status.Error(code, "scripted")
		}
		return serving, nil
	}
}

func TestPushbackNeverRetriedEarly(t *testing.T) {
	var mu sync.Mutex
	var seen []time.Time
	h := &health{}
	inner := pushbackAfter(1, codes.ResourceExhausted, "300")
	h.check = func(ctx context.Context, i int64, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		mu.Lock()
		seen = append(seen, time.Now())
		mu.Unlock()
		return inner(ctx, i, r)
	}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}}))
	if _, err := cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if len(seen) != 2 {
		t.Fatalf("server saw %d calls, want 2", len(seen))
	}
	if gap := seen[1].Sub(seen[0]); gap < 300*time.Millisecond {
		t.Fatalf("retried after %v, before the 300 ms pushback", gap)
	}
}

func TestPushbackRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		code  codes.Code
		pb    string
		calls int64
	}{
		{"negative means do not retry", codes.Unavailable, "-1", 1},
		{"malformed means do not retry", codes.Unavailable, "soon", 1},
		{"over the cap is not retried early", codes.Unavailable, "60000", 1},
		{"resource exhausted with pushback", codes.ResourceExhausted, "1", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &health{check: pushbackAfter(1, tc.code, tc.pb)}
			cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, Retry: guardrail.Retry{MaxRetryAfter: 5 * time.Second}}))
			start := time.Now()
			cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
			if got := h.calls.Load(); got != tc.calls {
				t.Fatalf("server saw %d calls, want %d", got, tc.calls)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Fatalf("took %v: a refused retry must not wait", d)
			}
		})
	}
	t.Run("resource exhausted without pushback", func(t *testing.T) {
		h := &health{check: failFirst(1, codes.ResourceExhausted)}
		cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}}))
		cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
		if got := h.calls.Load(); got != 1 {
			t.Fatalf("server saw %d calls, want 1", got)
		}
	})
	t.Run("pushback beyond the deadline", func(t *testing.T) {
		h := &health{check: pushbackAfter(1, codes.Unavailable, "2000")}
		cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}}))
		start := time.Now()
		_, err := cl.Check(ctxTimeout(t, time.Second), &healthpb.HealthCheckRequest{})
		if !errors.Is(err, guardrail.ErrDeadline) {
			t.Fatalf("err = %v, want ErrDeadline", err)
		}
		if d := time.Since(start); d > 500*time.Millisecond {
			t.Fatalf("took %v: a pushback that does not fit must end the call at once", d)
		}
		if got := h.calls.Load(); got != 1 {
			t.Fatalf("server saw %d calls, want 1", got)
		}
	})
}

func TestSustainedUnavailableOpensBreaker(t *testing.T) {
	h := &health{check: failFirst(1<<40, codes.Unavailable)}
	group := newGroup(t, breaker.Config{MinRequests: 10, OpenFor: time.Minute})
	c := newClient(t, guardgrpc.ClientConfig{Breakers: group, Retry: guardrail.Retry{MaxAttempts: 1}})
	cl := dial(t, serve(t, h), c)
	ctx := ctxTimeout(t, 10*time.Second)
	for range 10 {
		cl.Check(ctx, &healthpb.HealthCheckRequest{})
	}
	seen := h.calls.Load()
	const n = 1000
	start := time.Now()
	for range n {
		_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
		if !errors.Is(err, guardrail.ErrCircuitOpen) || status.Code(err) != codes.Unavailable {
			t.Fatalf("err = %v, want ErrCircuitOpen with UNAVAILABLE", err)
		}
	}
	per := time.Since(start) / n
	if per > 200*time.Microsecond {
		t.Fatalf("a refused call took %v, want microseconds", per)
	}
	if got := h.calls.Load(); got != seen {
		t.Fatalf("server saw %d more calls with the breaker open", got-seen)
	}
}

func TestHalfOpenAdmitsExactlyTheProbes(t *testing.T) {
	const probes = 3
	var failing atomic.Bool
	failing.Store(true)
	gate := make(chan struct{})
	arrived := make(chan struct{}, 200)
	h := &health{check: func(ctx context.Context, _ int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if failing.Load() {
			return nil, status.Error(codes.Unavailable, "down")
		}
		arrived <- struct{}{}
		<-gate
		return serving, nil
	}}
	const openFor = 200 * time.Millisecond
	group := newGroup(t, breaker.Config{
		MinRequests: 5, OpenFor: openFor, OpenJitter: -1, HalfOpenProbes: probes})
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{Breakers: group, Retry: guardrail.Retry{MaxAttempts: 1}}))
	ctx := ctxTimeout(t, 20*time.Second)
	for range 5 {
		cl.Check(ctx, &healthpb.HealthCheckRequest{})
	}
	var b *breaker.Breaker
	group.Range(func(_ string, x *breaker.Breaker) bool { b = x; return false })
	if b == nil || b.State() != breaker.Open {
		t.Fatalf("breaker not open after sustained failures")
	}
	failing.Store(false)
	seen := h.calls.Load()
	time.Sleep(openFor + 50*time.Millisecond) // the open time must pass; nothing to wait on

	var wg sync.WaitGroup
	var open, ok atomic.Int64
	startGate := make(chan struct{})
	for range 200 {
		wg.Go(func() {
			<-startGate
			_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, guardrail.ErrCircuitOpen):
				open.Add(1)
			default:
				t.Errorf("unexpected error %v", err)
			}
		})
	}
	close(startGate)
	for range probes {
		<-arrived
	}
	// Every goroutine that is not a probe is refused without waiting on
	// the probes: wait for them before letting the probes finish.
	for open.Load() < 200-probes {
		time.Sleep(time.Millisecond)
		if ctx.Err() != nil {
			t.Fatalf("only %d of %d non-probes refused", open.Load(), 200-probes)
		}
	}
	close(gate)
	wg.Wait()
	if got := h.calls.Load() - seen; got != probes {
		t.Fatalf("server saw %d calls half-open, want exactly %d probes", got, probes)
	}
	if ok.Load() != probes || open.Load() != 200-probes {
		t.Fatalf("ok %d, refused %d; want %d and %d", ok.Load(), open.Load(), probes, 200-probes)
	}
}

func TestStreamRetriedBeforeFirstMessage(t *testing.T) {
	h := &health{watch: func(n int64, _ *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error {
		if n == 1 {
			return status.Error(codes.Unavailable, "not yet")
		}
		s.Send(serving)
		s.Send(serving)
		return nil
	}}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{watchMethod}}))
	st, err := cl.Watch(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{Service: "x"})
	if err != nil {
		t.Fatal(err)
	}
	got := 0
	for {
		_, err := st.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		got++
	}
	if got != 2 || h.calls.Load() != 2 {
		t.Fatalf("got %d messages from %d server calls, want 2 from 2", got, h.calls.Load())
	}
}

func TestStreamNeverRetriedAfterFirstMessage(t *testing.T) {
	h := &health{watch: func(n int64, _ *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error {
		s.Send(serving)
		return status.Error(codes.Unavailable, "gone")
	}}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{watchMethod}}))
	st, err := cl.Watch(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatalf("first Recv: %v", err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("second Recv: %v, want UNAVAILABLE", err)
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("server saw %d calls, want 1", got)
	}
}

func TestStreamNotIdempotentNotRetriedAfterOpen(t *testing.T) {
	h := &health{watch: func(int64, *healthpb.HealthCheckRequest, healthpb.Health_WatchServer) error {
		return status.Error(codes.Unavailable, "no")
	}}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{}))
	st, err := cl.Watch(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.Unavailable {
		t.Fatalf("Recv: %v, want UNAVAILABLE", err)
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("server saw %d calls, want 1", got)
	}
}

func TestServiceConfigRetriesLeftToGRPC(t *testing.T) {
	h := &health{check: failFirst(1, codes.Unavailable)}
	const sc = `{"methodConfig":[{"name":[{"service":"grpc.health.v1.Health"}],
		"retryPolicy":{"maxAttempts":4,"initialBackoff":"0.01s","maxBackoff":"0.01s","backoffMultiplier":1,"retryableStatusCodes":["UNAVAILABLE"]}}]}`
	addr := serve(t, h)
	// Interceptors installed alone, on a connection whose service config
	// retries: guardgrpc makes one attempt and grpc-go retries.
	obs := &countAttempts{}
	c := newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, Observer: obs})
	cl := dial(t, addr, nil, grpc.WithDefaultServiceConfig(sc),
		grpc.WithUnaryInterceptor(c.UnaryClientInterceptor()))
	h.check = failFirst(2, codes.Unavailable)
	if _, err := cl.Check(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got, att := h.calls.Load(), obs.n.Load(); got != 3 || att != 1 {
		t.Fatalf("server saw %d calls from %d guardgrpc attempts; want 3 from 1 (grpc-go retried)", got, att)
	}
	// Through DialOptions grpc-go's retries are off and guardgrpc retries.
	h.calls.Store(0)
	obs.n.Store(0)
	cl = dial(t, addr, c, grpc.WithDefaultServiceConfig(sc))
	if _, err := cl.Check(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got, att := h.calls.Load(), obs.n.Load(); got != 3 || att != 3 {
		t.Fatalf("server saw %d calls from %d guardgrpc attempts; want 3 from 3", got, att)
	}
}

func TestBulkheadRefusesOverflow(t *testing.T) {
	gate := make(chan struct{})
	in := make(chan struct{}, 4)
	h := &health{check: func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		in <- struct{}{}
		<-gate
		return serving, nil
	}}
	c := newClient(t, guardgrpc.ClientConfig{Bulkhead: &bulkheadCfg})
	cl := dial(t, serve(t, h), c)
	ctx := ctxTimeout(t, 10*time.Second)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { cl.Check(ctx, &healthpb.HealthCheckRequest{}) })
	}
	<-in
	<-in
	_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
	close(gate)
	wg.Wait()
	if !errors.Is(err, guardrail.ErrBulkheadFull) || status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("err = %v, want ErrBulkheadFull with RESOURCE_EXHAUSTED", err)
	}
}

// A fleet.Semaphore behind the bulkhead: a call refused because the
// fleet's slots are taken is RESOURCE_EXHAUSTED like a local refusal.
func TestBulkheadSharedByFleet(t *testing.T) {
	sem, err := fleet.NewSemaphore(fleet.SemaphoreConfig{Store: new(fleet.MemorySemaphoreStore), Name: "health", Limit: 1, MaxWait: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer sem.Close()
	c := newClient(t, guardgrpc.ClientConfig{Bulkhead: &bulkhead.Config{MaxConcurrent: 10, Shared: sem}})
	cl := dial(t, serve(t, &health{}), c)
	ctx := ctxTimeout(t, 10*time.Second)
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check with the fleet's slot free: %v", err)
	}
	release, err := sem.Acquire(ctx) // another process of the fleet
	if err != nil {
		t.Fatal(err)
	}
	defer release()
	_, err = cl.Check(ctx, &healthpb.HealthCheckRequest{})
	if !errors.Is(err, guardrail.ErrBulkheadFull) || !errors.Is(err, fleet.ErrFull) || status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("err = %v, want ErrBulkheadFull from fleet.ErrFull with RESOURCE_EXHAUSTED", err)
	}
}

func TestNewClientRejectsInvalidConfig(t *testing.T) {
	for _, cfg := range []guardgrpc.ClientConfig{
		{Retry: guardrail.Retry{MaxAttempts: -1}},
		{Retry: guardrail.Retry{AttemptTimeout: -time.Second}},
		{IdempotentMethods: []string{"Check"}},
		{Bulkhead: &bulkhead.Config{MaxConcurrent: -1}},
	} {
		if _, err := guardgrpc.NewClient(cfg); !errors.Is(err, guardgrpc.ErrInvalidConfig) {
			t.Errorf("NewClient(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// opEvents records the kinds and operations of events.
type opEvents struct {
	mu    sync.Mutex
	kinds []string
	ops   map[string]bool
}

func (o *opEvents) Observe(ctx context.Context, e event.Event) context.Context {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.kinds = append(o.kinds, e.Kind.String())
	if o.ops == nil {
		o.ops = map[string]bool{}
	}
	o.ops[e.Operation] = true
	return ctx
}

func TestEventsNameTheMethod(t *testing.T) {
	h := &health{check: failFirst(1, codes.Unavailable)}
	obs := &opEvents{}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{Observer: obs, IdempotentMethods: []string{checkMethod}}))
	if _, err := cl.Check(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	want := []string{"call_start", "attempt_start", "attempt_end", "retry", "attempt_start", "attempt_end", "call_end"}
	if !equal(obs.kinds, want) {
		t.Fatalf("events %v, want %v", obs.kinds, want)
	}
	if len(obs.ops) != 1 || !obs.ops[checkMethod] {
		t.Fatalf("operations %v, want only %q", obs.ops, checkMethod)
	}
}

func TestAttemptSeamSeesEveryAttempt(t *testing.T) {
	h := &health{check: failFirst(1, codes.Unavailable)}
	var seen []bool
	c := newClient(t, guardgrpc.ClientConfig{
		IdempotentMethods: []string{checkMethod},
		Attempt: func(ctx context.Context, a *guardgrpc.Attempt) error {
			seen = append(seen, a.Idempotent)
			// The caller's WaitForReady (and the generated code's own
			// option) come first; the Client's trailer option after them.
			if len(a.Opts) != len(a.CallerOpts)+1 || len(a.CallerOpts) < 1 {
				t.Errorf("caller options %d of %d, want the caller's and then the Client's one", len(a.CallerOpts), len(a.Opts))
			}
			return a.Invoke(ctx, a.Opts...)
		},
	})
	cl := dial(t, serve(t, h), c)
	if _, err := cl.Check(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{}, grpc.WaitForReady(false)); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 2 || !seen[0] || !seen[1] {
		t.Fatalf("Attempt saw %v, want two idempotent attempts", seen)
	}
}

func TestRetryBudgetBoundsRetries(t *testing.T) {
	h := &health{check: failFirst(1<<40, codes.Unavailable)}
	b, err := budget.New(budget.Config{Ratio: 0.1, Max: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{
		Budget: b,
	},
		IdempotentMethods: []string{checkMethod},
		Breakers:          newGroup(t, breaker.Config{Mode: breaker.Disabled})})
	cl := dial(t, serve(t, h), c)
	const calls = 50
	exhausted := 0
	for range calls {
		_, err := cl.Check(ctxTimeout(t, 5*time.Second), &healthpb.HealthCheckRequest{})
		if errors.Is(err, guardrail.ErrBudgetExhausted) {
			exhausted++
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("budget refusal carries %v, want the last attempt's UNAVAILABLE", status.Code(err))
			}
		}
	}
	// 1 token to start with and 0.1 per call: about 6 retries in all.
	if got := h.calls.Load(); got > calls+7 {
		t.Fatalf("server saw %d calls for %d callers: retries beyond the budget", got, calls)
	}
	if exhausted < calls-7 {
		t.Fatalf("%d calls ended with ErrBudgetExhausted, want nearly all %d", exhausted, calls)
	}
}
