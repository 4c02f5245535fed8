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

	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/shed"
)

// queueShedder is a Shedder of one slot and a queue of four, whose queue
// never stands: a queued call waits until a slot frees, its context ends
// or a minute passes.
func queueShedder(t testing.TB) *shed.Shedder {
	return newShedder(t, shed.Config{Limit: 1, Shares: map[shed.Priority]float64{shed.Normal: 1},
		MaxQueue: 4, MaxQueueWait: time.Minute, QueueInterval: time.Minute})
}

// gated is a Health service whose Check with a non-empty Service holds the
// call until that service's gate is closed or the call's context ends. It
// reports every call that reaches it on started.
type gated struct {
	healthpb.UnimplementedHealthServer
	started chan string
	mu      sync.Mutex
	gates   map[string]chan struct{}
}

func newGated() *gated {
	return &gated{started: make(chan string, 16), gates: make(map[string]chan struct{})}
}

func (g *gated) gate(name string) chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	c, ok := g.gates[name]
	if !ok {
		c = make(chan struct{})
		g.gates[name] = c
	}
	return c
}

func (g *gated) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	g.started <- req.Service
	select {
	case <-g.gate(req.Service):
		return serving, nil
	case <-ctx.Done():
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// reached waits for the next call to reach the handler and returns its
// name.
func (g *gated) reached(t *testing.T) string {
	t.Helper()
	select {
	case name := <-g.started:
		return name
	case <-time.After(10 * time.Second):
		t.Fatal("no call reached the handler in 10 s")
		return ""
	}
}

// TestQueuedCallsOnOneConnection holds a Shedder's one slot and queues
// calls behind it on a single connection. Each queued call must be served
// or refused on its own: the tap of the old code waited in the queue on
// the connection's reader goroutine, so the second call was never read
// and the cancel of the call holding the slot never seen.
func TestQueuedCallsOnOneConnection(t *testing.T) {
	sh := queueShedder(t)
	srv := newServer(t, guardgrpc.ServerConfig{Shedder: sh})
	g := newGated()
	cl := dial(t, serve(t, g, srv.ServerOptions()...), nil) // one connection
	ctx := ctxTimeout(t, 30*time.Second)

	type result struct {
		name    string
		err     error
		trailer metadata.MD
	}
	results := make(chan result, 8)
	cancels := map[string]context.CancelFunc{}
	var wg sync.WaitGroup
	defer wg.Wait()
	call := func(name string) {
		cctx, cancel := context.WithCancel(ctx)
		cancels[name] = cancel
		wg.Go(func() {
			defer cancel()
			var tr metadata.MD
			_, err := cl.Check(cctx, &healthpb.HealthCheckRequest{Service: name}, grpc.Trailer(&tr))
			results <- result{name, err, tr}
		})
	}
	defer func() {
		for _, c := range cancels {
			c()
		}
	}()

	call("holder")
	if got := g.reached(t); got != "holder" {
		t.Fatalf("%q reached the handler, want holder", got)
	}
	for i, name := range []string{"b", "c", "d", "e"} {
		call(name)
		waitFor(t, func() bool { return sh.Stats().Queued == i+1 })
	}
	// The queue is full: the next call is refused at once, with the
	// pushback, while the four stay queued.
	var tr metadata.MD
	_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{Service: "f"}, grpc.Trailer(&tr))
	if status.Code(err) != codes.Unavailable || len(tr.Get(guardgrpc.MDPushback)) != 1 {
		t.Fatalf("call to a full queue: %v, trailer %v; want UNAVAILABLE with a pushback", err, tr)
	}
	if st := sh.Stats(); st.Queued != 4 || st.ShedByReason[event.ReasonQueueFull] != 1 {
		t.Fatalf("queued %d, shed for a full queue %d; want 4 and 1", st.Queued, st.ShedByReason[event.ReasonQueueFull])
	}

	// A queued call that gives up leaves the queue and never runs.
	cancels["c"]()
	if r := <-results; r.name != "c" || status.Code(r.err) != codes.Canceled {
		t.Fatalf("%s: %v, want c cancelled", r.name, r.err)
	}
	waitFor(t, func() bool { return sh.Stats().Queued == 3 })

	// The holder's client gives up: its cancel is read, its handler
	// returns, and its slot goes to the first call queued.
	cancels["holder"]()
	if r := <-results; r.name != "holder" || status.Code(r.err) != codes.Canceled {
		t.Fatalf("%s: %v, want holder cancelled", r.name, r.err)
	}
	if got := g.reached(t); got != "b" {
		t.Fatalf("%q got the freed slot, want b", got)
	}
	// Then each release admits the next, in order.
	for _, next := range []string{"d", "e"} {
		prev := map[string]string{"d": "b", "e": "d"}[next]
		close(g.gate(prev))
		if r := <-results; r.name != prev || r.err != nil {
			t.Fatalf("%s: %v, want %s served", r.name, r.err, prev)
		}
		if got := g.reached(t); got != next {
			t.Fatalf("%q got the slot, want %s", got, next)
		}
	}
	close(g.gate("e"))
	if r := <-results; r.name != "e" || r.err != nil {
		t.Fatalf("%s: %v, want e served", r.name, r.err)
	}
	if st := sh.Stats(); st.InFlight != 0 || st.Queued != 0 || st.Admitted != 4 {
		t.Fatalf("in flight %d, queued %d, admitted %d; want 0, 0 and 4 (holder, b, d, e)", st.InFlight, st.Queued, st.Admitted)
	}
	select {
	case name := <-g.started:
		t.Fatalf("%q reached the handler; c and f must not", name)
	default:
	}
}

// TestExpiredCallIsNotShed sends calls whose deadline passes before
// admission, or while they wait in the queue, to a server with a
// Shedder: each must get DEADLINE_EXCEEDED with no pushback, and the
// first must not reach the shedder at all.
func TestExpiredCallIsNotShed(t *testing.T) {
	t.Run("before admission", func(t *testing.T) {
		sh := queueShedder(t)
		srv := newServer(t, guardgrpc.ServerConfig{Shedder: sh})
		h := &health{}
		reached := make(chan error, 1)
		cl := dial(t, serve(t, h, grpc.UnaryInterceptor(expireAhead(srv.UnaryServerInterceptor(), reached))), nil)
		var tr metadata.MD
		_, err := cl.Check(ctxTimeout(t, time.Minute), &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr))
		if status.Code(err) != codes.DeadlineExceeded || tr.Get(guardgrpc.MDPushback) != nil {
			t.Fatalf("call that arrived expired: %v, trailer %v; want DEADLINE_EXCEEDED and no pushback", err, tr)
		}
		if err := <-reached; status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("interceptor returned %v, want DEADLINE_EXCEEDED", err)
		}
		if st := sh.Stats(); st.Shed != 0 || st.Admitted != 0 || h.calls.Load() != 0 {
			t.Fatalf("shed %d, admitted %d, handler ran %d times; want 0, 0 and 0", st.Shed, st.Admitted, h.calls.Load())
		}
	})
	t.Run("while queued", func(t *testing.T) {
		// The server's MaxTimeout passes while the call waits, long before
		// the queue would give up on it: the client still has time, and
		// sees what the server answered.
		sh := newShedder(t, shed.Config{Limit: 1, Shares: map[shed.Priority]float64{shed.Normal: 1},
			MaxQueue: 4, MaxQueueWait: 10 * time.Second, QueueInterval: time.Minute})
		tok, err := sh.Acquire(context.Background(), shed.Critical)
		if err != nil {
			t.Fatal(err)
		}
		defer tok.Release()
		srv := newServer(t, guardgrpc.ServerConfig{Shedder: sh, MaxTimeout: 200 * time.Millisecond})
		h := &health{}
		cl := dial(t, serve(t, h, srv.ServerOptions()...), nil)
		var tr metadata.MD
		_, err = cl.Check(ctxTimeout(t, time.Minute), &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr))
		if status.Code(err) != codes.DeadlineExceeded || tr.Get(guardgrpc.MDPushback) != nil {
			t.Fatalf("call whose deadline passed in the queue: %v, trailer %v; want DEADLINE_EXCEEDED and no pushback", err, tr)
		}
		if h.calls.Load() != 0 {
			t.Fatalf("handler ran %d times, want 0", h.calls.Load())
		}
		// A stream opening waits in the same queue.
		st, err := cl.Watch(ctxTimeout(t, time.Minute), &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = st.Recv()
		}
		if status.Code(err) != codes.DeadlineExceeded || st.Trailer().Get(guardgrpc.MDPushback) != nil {
			t.Fatalf("stream whose deadline passed in the queue: %v, trailer %v; want DEADLINE_EXCEEDED and no pushback", err, st.Trailer())
		}
		if h.calls.Load() != 0 {
			t.Fatalf("handler ran %d times, want 0", h.calls.Load())
		}
	})
}

// expireAhead is an interceptor, installed ahead of next, that is slower
// than a deadline of its own: next gets the call with that deadline
// passed, while the client, whose deadline is far, waits for the answer.
// What next returned goes to reached.
func expireAhead(next grpc.UnaryServerInterceptor, reached chan<- error) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
		defer cancel()
		<-ctx.Done()
		resp, err := next(ctx, req, info, handler)
		reached <- err
		return resp, err
	}
}
