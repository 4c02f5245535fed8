package guardgrpc_test

import (
	"context"
	"errors"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/shed"
)

func newShedder(t testing.TB, cfg shed.Config) *shed.Shedder {
	t.Helper()
	s, err := shed.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// blocking is a Health service whose Check holds every call until gate
// closes, counting those in its handler at once.
type blocking struct {
	health
	gate          chan struct{}
	inFlight, max atomic.Int64
}

func newBlocking() *blocking {
	b := &blocking{gate: make(chan struct{})}
	b.check = func(ctx context.Context, _ int64, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if req.Service == "fast" {
			return serving, nil
		}
		n := b.inFlight.Add(1)
		defer b.inFlight.Add(-1)
		for {
			m := b.max.Load()
			if n <= m || b.max.CompareAndSwap(m, n) {
				break
			}
		}
		select {
		case <-b.gate:
		case <-ctx.Done():
		}
		return serving, nil
	}
	return b
}

func TestOverloadShedsFastWithBoundedGoroutines(t *testing.T) {
	for _, all := range []bool{true, false} {
		name := "interceptor"
		if all {
			name = "ServerOptions"
		}
		t.Run(name, func(t *testing.T) {
			const limit, callers = 10, 100 // 10x overload
			sh := newShedder(t, shed.Config{Limit: limit, Shares: map[shed.Priority]float64{shed.Normal: 1}})
			srv := newServer(t, guardgrpc.ServerConfig{Shedder: sh})
			h := newBlocking()
			opts := srv.ServerOptions()
			if !all {
				opts = []grpc.ServerOption{grpc.UnaryInterceptor(srv.UnaryServerInterceptor())}
			}
			cl := dial(t, serve(t, h, opts...), nil)
			ctx := ctxTimeout(t, 20*time.Second)
			cl.Check(ctx, &healthpb.HealthCheckRequest{Service: "fast"}) // connect first
			base := runtime.NumGoroutine()

			// Fill the server, then overload it.
			var wg sync.WaitGroup
			for range limit {
				wg.Go(func() { cl.Check(ctx, &healthpb.HealthCheckRequest{}) })
			}
			waitFor(t, func() bool { return h.inFlight.Load() >= limit })
			var shedCalls atomic.Int64
			var peak atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			var ow sync.WaitGroup
			for range callers - limit {
				ow.Go(func() {
					var trailer metadata.MD
					start := time.Now()
					_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
					d := time.Since(start)
					if g := int64(runtime.NumGoroutine()); g > peak.Load() {
						peak.Store(g)
					}
					if status.Code(err) != codes.Unavailable {
						t.Errorf("overload call: %v, want UNAVAILABLE", err)
						return
					}
					shedCalls.Add(1)
					if trailer.Get(guardgrpc.MDPushback) == nil {
						t.Errorf("shed call has no %s trailer", guardgrpc.MDPushback)
					}
					mu.Lock()
					lat = append(lat, d)
					mu.Unlock()
				})
			}
			ow.Wait()
			// While the server stays full, one caller at a time: each shed
			// answer comes back in about a loopback round trip.
			var seq []time.Duration
			for range 21 {
				start := time.Now()
				_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{})
				seq = append(seq, time.Since(start))
				if status.Code(err) != codes.Unavailable {
					t.Fatalf("call to the full server: %v, want UNAVAILABLE", err)
				}
			}
			close(h.gate)
			wg.Wait()
			if got := h.max.Load(); got > limit {
				t.Fatalf("%d handlers ran at once, want at most %d", got, limit)
			}
			if shedCalls.Load() != callers-limit {
				t.Fatalf("%d calls shed, want %d", shedCalls.Load(), callers-limit)
			}
			// A call that was not shed would wait for the gate, which opens
			// only after every shed call returned: the median says "at
			// once", the slowest that nothing waited.
			slices.Sort(lat)
			if slowest := lat[len(lat)-1]; slowest > 2*time.Second {
				t.Fatalf("slowest of the burst's shed calls took %v: it waited", slowest)
			}
			slices.Sort(seq)
			if med := seq[len(seq)/2]; med > 25*time.Millisecond {
				t.Fatalf("a shed call took %v (median of %d), want milliseconds", med, len(seq))
			}
			if st := sh.Stats(); st.Shed != callers-limit+uint64(len(seq)) {
				t.Fatalf("shedder shed %d, want %d", st.Shed, callers-limit+len(seq))
			}
			// The test's own callers account for one goroutine each; shed
			// in the interceptor, a call holds a server goroutine only
			// while it is refused.
			bound := int64(2*callers + 30)
			if extra := peak.Load() - int64(base); extra > bound {
				t.Fatalf("%d goroutines above idle under overload, want at most %d", extra, bound)
			}
		})
	}
}

// shedEvents records the reasons of shed events and the operations.
type shedEvents struct {
	mu      sync.Mutex
	reasons []string
	ops     []string
}

func (s *shedEvents) Observe(ctx context.Context, e event.Event) context.Context {
	if e.Kind == event.Shed || e.Kind == event.Admit {
		s.mu.Lock()
		s.reasons = append(s.reasons, e.Kind.String()+":"+e.Reason)
		s.ops = append(s.ops, e.Operation)
		s.mu.Unlock()
	}
	return ctx
}

func TestPriorityFromMetadataMayLowerNotRaise(t *testing.T) {
	obs := &shedEvents{}
	// Sheddable may fill half the limit, Normal 80 %, Critical all of it.
	sh := newShedder(t, shed.Config{Limit: 10, Observer: obs, Shares: map[shed.Priority]float64{
		shed.Sheddable: 0.5, shed.Normal: 0.8, shed.Critical: 1}})
	srv := newServer(t, guardgrpc.ServerConfig{Shedder: sh, Observer: obs})
	h := newBlocking()
	cl := dial(t, serve(t, h, srv.ServerOptions()...), nil)
	ctx := ctxTimeout(t, 20*time.Second)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(h.gate)
	for range 5 {
		wg.Go(func() { cl.Check(ctx, &healthpb.HealthCheckRequest{}) })
	}
	waitFor(t, func() bool { return h.inFlight.Load() >= 5 })
	with := func(p string) context.Context {
		return metadata.AppendToOutgoingContext(ctx, guardgrpc.MDPriority, p)
	}
	// At 5 of 10, sheddable is refused.
	if _, err := cl.Check(with("sheddable"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("sheddable at half load: %v, want UNAVAILABLE", err)
	}
	for range 3 {
		wg.Go(func() { cl.Check(ctx, &healthpb.HealthCheckRequest{}) })
	}
	waitFor(t, func() bool { return h.inFlight.Load() >= 8 })
	// At 8 of 10, a claim of critical is capped at normal: refused.
	if _, err := cl.Check(with("critical"), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("critical claim at 80 %%: %v, want UNAVAILABLE (metadata must not raise a priority)", err)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	for _, op := range obs.ops {
		if op != checkMethod {
			t.Fatalf("shed event operation %q, want %q", op, checkMethod)
		}
	}
}

func TestRetryAwareAdmission(t *testing.T) {
	obs := &shedEvents{}
	sh := newShedder(t, shed.Config{Limit: 10, Observer: obs, RetryBurst: 1, RetryRatio: 0.01,
		Shares: map[shed.Priority]float64{shed.Normal: 1}})
	srv := newServer(t, guardgrpc.ServerConfig{Shedder: sh})
	h := newBlocking()
	cl := dial(t, serve(t, h, srv.ServerOptions()...), nil)
	ctx := ctxTimeout(t, 20*time.Second)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(h.gate)
	for range 6 { // above the default pressure of 50 %
		wg.Go(func() { cl.Check(ctx, &healthpb.HealthCheckRequest{}) })
	}
	waitFor(t, func() bool { return h.inFlight.Load() >= 6 })
	// The one retry token goes to the first retry (grpc-go's header)...
	wg.Go(func() {
		cl.Check(metadata.AppendToOutgoingContext(ctx, "grpc-previous-rpc-attempts", "1"), &healthpb.HealthCheckRequest{})
	})
	waitFor(t, func() bool { return h.inFlight.Load() >= 7 })
	// ...and the next retry (guardrail's header) is shed, while an
	// original is still admitted.
	_, err := cl.Check(metadata.AppendToOutgoingContext(ctx, guardgrpc.MDRetryAttempt, "2"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("second retry under pressure: %v, want UNAVAILABLE", err)
	}
	wg.Go(func() { cl.Check(ctx, &healthpb.HealthCheckRequest{}) })
	waitFor(t, func() bool { return h.inFlight.Load() >= 8 })
	if st := sh.Stats(); st.ShedByReason[event.ReasonRetryRatio] != 1 || st.AdmittedRetries != 1 {
		t.Fatalf("shed by retry ratio %d, retries admitted %d; want 1 and 1", st.ShedByReason[event.ReasonRetryRatio], st.AdmittedRetries)
	}
}

func TestDeadlineClamped(t *testing.T) {
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
	srv := newServer(t, guardgrpc.ServerConfig{MaxTimeout: 300 * time.Millisecond})
	cl := dial(t, serve(t, h, srv.ServerOptions()...), nil)
	for _, ctx := range []context.Context{ctxTimeout(t, 10*time.Second), context.Background()} {
		if _, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
		if d := <-left; d <= 0 || d > 300*time.Millisecond {
			t.Fatalf("handler saw %v left, want at most the server's 300 ms", d)
		}
	}
	// A shorter deadline is kept.
	if _, err := cl.Check(ctxTimeout(t, 200*time.Millisecond), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if d := <-left; d > 200*time.Millisecond {
		t.Fatalf("handler saw %v left, want the caller's 200 ms", d)
	}
}

func TestExpiredDeadlineRejectedWithoutHandler(t *testing.T) {
	h := &health{}
	srv := newServer(t, guardgrpc.ServerConfig{})
	reached := make(chan error, 1)
	cl := dial(t, serve(t, h, grpc.ChainUnaryInterceptor(expireAhead(srv.UnaryServerInterceptor(), reached))), nil)
	_, err := cl.Check(ctxTimeout(t, time.Minute), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("err = %v, want DEADLINE_EXCEEDED", err)
	}
	if err := <-reached; status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("interceptor returned %v, want DEADLINE_EXCEEDED", err)
	}
	if got := h.calls.Load(); got != 0 {
		t.Fatalf("handler ran %d times for an expired call, want 0", got)
	}
}

func TestStreamInterceptorShedsAndClamps(t *testing.T) {
	left := make(chan time.Duration, 1)
	h := &health{watch: func(_ int64, _ *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error {
		dl, _ := s.Context().Deadline()
		left <- time.Until(dl)
		return s.Send(serving)
	}}
	sh := newShedder(t, shed.Config{Limit: 1, Shares: map[shed.Priority]float64{shed.Normal: 1}})
	srv := newServer(t, guardgrpc.ServerConfig{Shedder: sh, MaxTimeout: 300 * time.Millisecond})
	cl := dial(t, serve(t, h, grpc.StreamInterceptor(srv.StreamServerInterceptor())), nil)
	st, err := cl.Watch(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	if d := <-left; d <= 0 || d > 300*time.Millisecond {
		t.Fatalf("stream handler saw %v left, want at most 300 ms", d)
	}
	// Hold the only slot, and the next stream is shed.
	tok, err := sh.Acquire(context.Background(), shed.Critical)
	if err != nil {
		t.Fatal(err)
	}
	defer tok.Release()
	st, err = cl.Watch(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = st.Recv()
	}
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("stream under full load: %v, want UNAVAILABLE", err)
	}
	if pb := st.Trailer().Get(guardgrpc.MDPushback); len(pb) != 1 {
		t.Fatalf("shed stream trailer %v, want a pushback", st.Trailer())
	}
}

func TestNewServerRejectsInvalidConfig(t *testing.T) {
	for _, cfg := range []guardgrpc.ServerConfig{
		{ShedCode: codes.Internal},
		{MaxPriority: shed.Critical + 1},
		{Keys: &guardgrpc.KeyConfig{}},
		{Keys: &guardgrpc.KeyConfig{Store: failingStore{}, SingleTenant: true, TTL: -time.Second}},
	} {
		if _, err := guardgrpc.NewServer(cfg); !errors.Is(err, guardgrpc.ErrInvalidConfig) {
			t.Errorf("NewServer(%+v) = %v, want ErrInvalidConfig", cfg, err)
		}
	}
}

// waitFor spins until cond holds, failing the test after 10 s.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10 s")
		}
		runtime.Gosched()
	}
}
