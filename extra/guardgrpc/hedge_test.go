package guardgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

// patience bounds a wait for something that happens at once when the code
// is right: far above what a loaded machine needs, far below the deadlines
// of the calls that would otherwise hang.
const patience = 10 * time.Second

// hedgeCfg hedges after a fixed delay: whether a hedge is due never
// depends on latencies learnt.
var hedgeCfg = &guardrail.HedgeConfig{Delay: 10 * time.Millisecond}

// slowFirst answers the first attempt of every call (one without
// x-retry-attempt) only when its context ends, and reports that end on
// ended; it answers every other attempt at once.
func slowFirst(ended chan<- error) func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return func(ctx context.Context, _ int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if len(md[guardgrpc.MDRetryAttempt]) == 0 {
			<-ctx.Done()
			select {
			case ended <- ctx.Err():
			default:
			}
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		grpc.SetHeader(ctx, metadata.Pairs("answered-by", first(md[guardgrpc.MDRetryAttempt])))
		return serving, nil
	}
}

// events records the events of the kinds it is told to keep.
type events struct {
	mu   sync.Mutex
	kept []event.Event
}

func (o *events) Observe(ctx context.Context, e event.Event) context.Context {
	switch e.Kind {
	case event.Hedge, event.HedgeRefused, event.Throttled:
		o.mu.Lock()
		o.kept = append(o.kept, e)
		o.mu.Unlock()
	}
	return ctx
}

func (o *events) of(k event.Kind) []event.Event {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []event.Event
	for _, e := range o.kept {
		if e.Kind == k {
			out = append(out, e)
		}
	}
	return out
}

func TestHedgeCutsTheSlowAttempt(t *testing.T) {
	ended := make(chan error, 1)
	h := &health{check: slowFirst(ended)}
	obs := &events{}
	c := newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, Hedge: hedgeCfg,
		Retry: guardrail.Retry{
			MaxAttempts: 1,
		},
		Observer: obs})
	cl := dial(t, serve(t, h), c)
	var header, trailer metadata.MD
	var p peer.Peer
	start := time.Now()
	resp, err := cl.Check(ctxTimeout(t, 60*time.Second), &healthpb.HealthCheckRequest{},
		grpc.Header(&header), grpc.Trailer(&trailer), grpc.Peer(&p))
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if d := time.Since(start); d > patience {
		t.Fatalf("took %v: the hedge should have answered long before the 60 s deadline", d)
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("reply %v, want the hedge's SERVING", resp)
	}
	if got := first(header["answered-by"]); got != "1" {
		t.Fatalf("caller's header says answered by %q, want the hedge's %q", got, "1")
	}
	if p.Addr == nil {
		t.Fatal("caller's peer not filled in")
	}
	if got := h.calls.Load(); got != 2 {
		t.Fatalf("server saw %d calls, want 2: the slow attempt and its hedge", got)
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("the slow attempt's server context ended with %v, want Canceled", err)
		}
	case <-time.After(patience):
		t.Fatal("the losing attempt's server context was never cancelled")
	}
	if got := c.RetryBudget().Tokens(); got != budget.DefaultMax-1 {
		t.Fatalf("budget holds %v tokens, want %v: a hedge spends one", got, budget.DefaultMax-1)
	}
	hedges := obs.of(event.Hedge)
	if len(hedges) != 1 || hedges[0].Operation != checkMethod || hedges[0].Attempt != 2 {
		t.Fatalf("hedge events %+v, want one for attempt 2 of %s", hedges, checkMethod)
	}
}

func TestHedgeNeverForNotIdempotentCalls(t *testing.T) {
	for _, tc := range []struct {
		name   string
		listed []string
		key    bool
	}{
		{"method not listed", nil, false},
		{"not listed, with an idempotency key", nil, true},
		{"listed, with an idempotency key", []string{checkMethod}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &health{check: slowFirst(make(chan error, 1))}
			obs := &events{}
			cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: tc.listed, Hedge: hedgeCfg,
				Retry: guardrail.Retry{
					MaxAttempts:    1,
					AttemptTimeout: 300 * time.Millisecond,
				},
				Observer: obs}))
			ctx := ctxTimeout(t, 60*time.Second)
			if tc.key {
				ctx = metadata.AppendToOutgoingContext(ctx, guardgrpc.MDIdempotencyKey, "k1")
			}
			_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("err = %v, want DEADLINE_EXCEEDED from the attempt timeout", err)
			}
			if got := h.calls.Load(); got != 1 {
				t.Fatalf("server saw %d calls, want exactly 1", got)
			}
			if got := obs.of(event.Hedge); len(got) != 0 {
				t.Fatalf("hedge events %+v, want none", got)
			}
		})
	}
}

func TestHedgeNeverForStreams(t *testing.T) {
	ended := make(chan struct{}, 1)
	h := &health{watch: func(n int64, _ *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error {
		if n == 1 {
			<-s.Context().Done()
			ended <- struct{}{}
			return s.Context().Err()
		}
		return s.Send(serving)
	}}
	obs := &events{}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{watchMethod}, Hedge: hedgeCfg, Observer: obs}))
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	st, err := cl.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Recv: %v, want DEADLINE_EXCEEDED: the stream's only copy hangs", err)
	}
	select {
	case <-ended:
	case <-time.After(patience):
		t.Fatal("the stream's server context never ended")
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("server saw %d streams, want exactly 1", got)
	}
	if got := obs.of(event.Hedge); len(got) != 0 {
		t.Fatalf("hedge events %+v, want none", got)
	}
}

// scripted answers calls for the service "scripted" with answer, on every
// attempt, and the others as slowFirst does; slow counts the latter.
func scripted(answer func(ctx context.Context) error, slow *atomic.Int64) func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	slowly := slowFirst(make(chan error, 1))
	return func(ctx context.Context, n int64, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if r.Service == "scripted" {
			return nil, answer(ctx)
		}
		slow.Add(1)
		return slowly(ctx, n, r)
	}
}

func TestHedgePausedByOverloadAnswers(t *testing.T) {
	for _, tc := range []struct {
		name     string
		code     codes.Code
		pushback string // "" for none
		paused   bool
	}{
		{"resource exhausted", codes.ResourceExhausted, "", true},
		{"resource exhausted with pushback", codes.ResourceExhausted, "5", true},
		{"unavailable with pushback", codes.Unavailable, "0", true},
		{"unavailable with do-not-retry pushback", codes.Unavailable, "-1", true},
		{"any code with pushback", codes.Internal, "5", true},
		{"unavailable alone", codes.Unavailable, "", false},
		{"not found", codes.NotFound, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var slow atomic.Int64
			h := &health{check: scripted(func(ctx context.Context) error {
				if tc.pushback != "" {
					grpc.SetTrailer(ctx, metadata.Pairs(guardgrpc.MDPushback, tc.pushback))
				}
				return status.Error(tc.code, "scripted")
			}, &slow)}
			obs := &events{}
			cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, Hedge: hedgeCfg,
				Retry: guardrail.Retry{
					MaxAttempts:    1,
					AttemptTimeout: 300 * time.Millisecond,
				},
				Observer: obs}))
			ctx := ctxTimeout(t, 60*time.Second)
			if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{Service: "scripted"}); status.Code(err) != tc.code {
				t.Fatalf("first call: %v, want %v", err, tc.code)
			}
			before := len(obs.of(event.Hedge)) // a loaded machine may have hedged the first call
			_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
			hedges, refused := obs.of(event.Hedge)[before:], obs.of(event.HedgeRefused)
			if !tc.paused {
				if err != nil || slow.Load() != 2 || len(hedges) != 1 {
					t.Fatalf("second call: %v after %d calls, %d hedges; want it hedged and answered", err, slow.Load(), len(hedges))
				}
				return
			}
			if status.Code(err) != codes.DeadlineExceeded {
				t.Fatalf("second call: %v, want DEADLINE_EXCEEDED: its only attempt hangs", err)
			}
			if got := slow.Load(); got != 1 {
				t.Fatalf("server saw %d calls, want 1: no hedge after the overload answer", got)
			}
			// While paused the engine does not even start a hedge timer,
			// so there is no refusal to report either.
			if len(hedges) != 0 || len(refused) != 0 {
				t.Fatalf("hedges %+v, refused %+v; want none", hedges, refused)
			}
		})
	}
}

func TestHedgeOverloadAnswerToTheHedgeItself(t *testing.T) {
	// The server answers the hedges RESOURCE_EXHAUSTED: one is sent, the
	// answer pauses hedging, and the next call sends none.
	slow := slowFirst(make(chan error, 2))
	h := &health{check: func(ctx context.Context, n int64, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if len(md[guardgrpc.MDRetryAttempt]) > 0 {
			return nil, status.Error(codes.ResourceExhausted, "overloaded")
		}
		return slow(ctx, n, r)
	}}
	obs := &events{}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, Hedge: hedgeCfg,
		Retry: guardrail.Retry{
			MaxAttempts:    1,
			AttemptTimeout: 300 * time.Millisecond,
		},
		Observer: obs}))
	ctx := ctxTimeout(t, 60*time.Second)
	for range 2 {
		if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("Check: %v, want the slow attempt's DEADLINE_EXCEEDED", err)
		}
	}
	if got := h.calls.Load(); got != 3 {
		t.Fatalf("server saw %d calls, want 3: two slow attempts and one hedge", got)
	}
	if got := obs.of(event.Hedge); len(got) != 1 {
		t.Fatalf("hedge events %+v, want the first call's only", got)
	}
}

func TestHedgeNotWhileBreakerIsNotClosed(t *testing.T) {
	var slow atomic.Int64
	h := &health{check: scripted(func(context.Context) error { return status.Error(codes.Internal, "broken") }, &slow)}
	// One failure opens the breaker; the open time is so short that the
	// next call is its half-open probe.
	group := newGroup(t, breaker.Config{ConsecutiveFailures: 1, OpenFor: time.Nanosecond, OpenJitter: -1})
	obs := &events{}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, Hedge: hedgeCfg,
		Retry: guardrail.Retry{
			MaxAttempts:    1,
			AttemptTimeout: 300 * time.Millisecond,
		},
		Breakers: group, Observer: obs}))
	ctx := ctxTimeout(t, 60*time.Second)
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{Service: "scripted"}); status.Code(err) != codes.Internal {
		t.Fatalf("first call: %v, want INTERNAL", err)
	}
	before := len(obs.of(event.Hedge)) // a loaded machine may have hedged the first call
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("probe: %v, want DEADLINE_EXCEEDED: its only attempt hangs", err)
	}
	if got := slow.Load(); got != 1 {
		t.Fatalf("server saw %d calls, want 1: the probe is never hedged", got)
	}
	if refused := obs.of(event.HedgeRefused); len(refused) == 0 || refused[len(refused)-1].Reason != event.ReasonBreakerOpen {
		t.Fatalf("refused hedges %+v, want the probe's, for %q", refused, event.ReasonBreakerOpen)
	}

	var b *breaker.Breaker
	group.Range(func(_ string, x *breaker.Breaker) bool { b = x; return false })
	b.ForceOpen()
	if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); !errors.Is(err, guardrail.ErrCircuitOpen) {
		t.Fatalf("with the breaker open: %v, want ErrCircuitOpen", err)
	}
	if got := slow.Load(); got != 1 {
		t.Fatalf("server saw %d calls with the breaker open, want none", got-1)
	}
	if got := obs.of(event.Hedge)[before:]; len(got) != 0 {
		t.Fatalf("hedge events %+v, want none", got)
	}
}

func TestHedgeNotWhenBudgetIsLow(t *testing.T) {
	h := &health{check: slowFirst(make(chan error, 1))}
	b, err := budget.New(budget.Config{Max: 10})
	if err != nil {
		t.Fatal(err)
	}
	for range 6 {
		b.TryRetry() // 4 tokens left: below half the maximum
	}
	obs := &events{}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, Hedge: hedgeCfg,
		Retry: guardrail.Retry{
			MaxAttempts:    1,
			AttemptTimeout: 300 * time.Millisecond,
			Budget:         b,
		},
		Observer: obs}))
	if _, err := cl.Check(ctxTimeout(t, 60*time.Second), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Check: %v, want DEADLINE_EXCEEDED: its only attempt hangs", err)
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("server saw %d calls, want 1", got)
	}
	if refused := obs.of(event.HedgeRefused); len(refused) != 1 || refused[0].Reason != event.ReasonBudget {
		t.Fatalf("refused hedges %+v, want one, for %q", refused, event.ReasonBudget)
	}
}

func TestHedgeWinnerCopiedWhileFirstAnswerIsDiscarded(t *testing.T) {
	// Many calls at once, each with a slow first attempt that answers
	// NOT_SERVING when cancelled late, and a hedge that answers SERVING:
	// every caller must see its own hedge's reply, whole (run with -race).
	h := &health{check: func(ctx context.Context, _ int64, r *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if len(md[guardgrpc.MDRetryAttempt]) == 0 {
			<-ctx.Done()
			return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_NOT_SERVING}, nil
		}
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}}
	cl := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, Hedge: hedgeCfg,
		Retry: guardrail.Retry{
			MaxAttempts: 1,
			Budget:      budget.Unlimited(),
		},
	}))
	ctx := ctxTimeout(t, 60*time.Second)
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			resp, err := cl.Check(ctx, &healthpb.HealthCheckRequest{Service: "x"})
			if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
				t.Errorf("Check: %v, %v; want the hedge's SERVING", resp, err)
			}
		})
	}
	wg.Wait()
}

func TestHedgeRunsEachCopyThroughTheAttemptSeam(t *testing.T) {
	h := &health{check: slowFirst(make(chan error, 1))}
	var seen atomic.Int64
	c := newClient(t, guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod}, Hedge: hedgeCfg, Retry: guardrail.Retry{
		MaxAttempts: 1,
	},
		Attempt: func(ctx context.Context, a *guardgrpc.Attempt) error {
			seen.Add(1)
			for _, o := range a.CallerOpts {
				if _, ok := o.(grpc.HeaderCallOption); ok {
					t.Error("CallerOpts hold a header option: two copies would write it")
				}
			}
			return a.Invoke(ctx, a.Opts...)
		}})
	cl := dial(t, serve(t, h), c)
	var header metadata.MD
	if _, err := cl.Check(ctxTimeout(t, 60*time.Second), &healthpb.HealthCheckRequest{}, grpc.Header(&header)); err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got := seen.Load(); got != 2 {
		t.Fatalf("Attempt ran %d times, want 2: the slow copy and its hedge", got)
	}
	if got := first(header["answered-by"]); got != "1" {
		t.Fatalf("caller's header says answered by %q, want the hedge's", got)
	}
}

func TestNewClientRejectsInvalidHedge(t *testing.T) {
	_, err := guardgrpc.NewClient(guardgrpc.ClientConfig{Hedge: &guardrail.HedgeConfig{Delay: -time.Second}})
	if !errors.Is(err, guardgrpc.ErrInvalidConfig) || !errors.Is(err, guardrail.ErrInvalidConfig) {
		t.Fatalf("err = %v, want ErrInvalidConfig wrapping ErrInvalidConfig", err)
	}
	if !strings.Contains(err.Error(), "ClientConfig.Hedge") || !strings.Contains(err.Error(), "Delay") {
		t.Fatalf("err = %q, want it to name ClientConfig.Hedge and Delay", err)
	}
}
