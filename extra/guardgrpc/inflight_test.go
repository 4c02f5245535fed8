package guardgrpc_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

// connListener remembers every connection it accepted, by the peer's
// address, so that a handler can drop its caller's connection.
type connListener struct {
	net.Listener
	mu    sync.Mutex
	conns map[string]net.Conn
}

func (l *connListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.mu.Lock()
		l.conns[c.RemoteAddr().String()] = c
		l.mu.Unlock()
	}
	return c, err
}

func (l *connListener) drop(addr string) {
	l.mu.Lock()
	c := l.conns[addr]
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
}

// keyOf returns the call's idempotency key.
func keyOf(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, guardgrpc.MDIdempotencyKey); len(v) == 1 {
		return v[0]
	}
	return ""
}

// A keyed call whose first attempt's connection drops mid-handler is
// retried with the same key; the retry meets ABORTED with a pushback while
// the first run goes on, waits for the pushback, and then gets the stored
// answer: the handler ran once per key and every caller got its answer.
func TestInFlightAbortedRetried(t *testing.T) {
	const callers = 20
	const pushback = 100 * time.Millisecond
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &connListener{Listener: lis, conns: map[string]net.Conn{}}

	var mu sync.Mutex
	runs := map[string]int{}
	aborted := map[string]int{}
	answered := map[string]chan struct{}{} // closed at the key's first ABORTED
	signal := func(key string) chan struct{} {
		ch, ok := answered[key]
		if !ok {
			ch = make(chan struct{})
			answered[key] = ch
		}
		return ch
	}
	h := &health{}
	h.check = func(ctx context.Context, _ int64, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		key := keyOf(ctx)
		mu.Lock()
		runs[key]++
		first := runs[key] == 1
		ch := signal(key)
		mu.Unlock()
		if first {
			// The caller's connection drops while the charge runs on, and
			// the charge ends only once a retry was told it is in flight.
			p, _ := peer.FromContext(ctx)
			cl.drop(p.Addr.String())
			select {
			case <-ch:
			case <-time.After(30 * time.Second): // a hang, not a result
			}
		}
		return serving, nil
	}
	watch := func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if status.Code(err) == codes.Aborted {
			key := keyOf(ctx)
			mu.Lock()
			aborted[key]++
			if aborted[key] == 1 {
				close(signal(key))
			}
			mu.Unlock()
		}
		return resp, err
	}
	srv := newServer(t, guardgrpc.ServerConfig{Keys: &guardgrpc.KeyConfig{
		Store: newMemstore(t), SingleTenant: true, RetryAfter: pushback, Logger: slog.New(slog.DiscardHandler),
	}})
	gs := grpc.NewServer(grpc.ChainUnaryInterceptor(watch, srv.UnaryServerInterceptor()))
	healthpb.RegisterHealthServer(gs, h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		gs.Serve(cl)
	}()
	t.Cleanup(func() {
		gs.Stop()
		<-done
	})

	client := newClient(t, guardgrpc.ClientConfig{
		Retry:    guardrail.Retry{MaxAttempts: 6, Budget: budget.Unlimited(), Backoff: backoff.Constant(time.Millisecond)},
		Breakers: newGroup(t, breaker.Config{MinRequests: 1000}), // 20 drops at once are not what is tested
	})
	var wg sync.WaitGroup
	errs := make([]error, callers)
	took := make([]time.Duration, callers)
	for i := range callers {
		// A connection per caller: a drop cuts only its own call.
		conn, err := grpc.NewClient("passthrough:///"+lis.Addr().String(),
			append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, client.DialOptions()...)...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		hc := healthpb.NewHealthClient(conn)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			ctx = metadata.AppendToOutgoingContext(ctx, guardgrpc.MDIdempotencyKey, fmt.Sprintf("key-%d", i))
			start := time.Now()
			_, errs[i] = hc.Check(ctx, &healthpb.HealthCheckRequest{})
			took[i] = time.Since(start)
		})
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for i, err := range errs {
		if err != nil {
			t.Errorf("caller %d: %v", i, err)
		} else if took[i] < pushback {
			t.Errorf("caller %d done after %v, before the %v pushback", i, took[i], pushback)
		}
	}
	for k, n := range runs {
		if n != 1 {
			t.Errorf("handler ran %d times for %s, want 1", n, k)
		}
	}
	if len(runs) != callers {
		t.Errorf("handler ran for %d keys, want %d", len(runs), callers)
	}
	for i := range callers {
		if n := aborted[fmt.Sprintf("key-%d", i)]; n < 1 {
			t.Errorf("key-%d: never answered ABORTED; the test did not test the in-flight retry", i)
		}
	}
}

// ABORTED is final for a call without an idempotency key, pushback or
// not, and for a keyed one without a pushback.
func TestAbortedFinalWithoutKeyOrPushback(t *testing.T) {
	tests := []struct {
		name     string
		key      bool
		pushback string // "" for none
	}{
		{"no key", false, "10"},
		{"key, no pushback", true, ""},
		{"key, bad pushback", true, "-5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := &health{}
			h.check = func(ctx context.Context, _ int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
				if tt.pushback != "" {
					grpc.SetTrailer(ctx, metadata.Pairs(guardgrpc.MDPushback, tt.pushback))
				}
				return nil, status.Error(codes.Aborted, "in flight")
			}
			c := dial(t, serve(t, h), newClient(t, guardgrpc.ClientConfig{
				IdempotentMethods: []string{checkMethod},
				Retry:             guardrail.Retry{Budget: budget.Unlimited()},
			}))
			ctx := ctxTimeout(t, 10*time.Second)
			if tt.key {
				ctx = metadata.AppendToOutgoingContext(ctx, guardgrpc.MDIdempotencyKey, "k")
			}
			_, err := c.Check(ctx, &healthpb.HealthCheckRequest{})
			if status.Code(err) != codes.Aborted {
				t.Fatalf("err = %v, want ABORTED", err)
			}
			if n := h.calls.Load(); n != 1 {
				t.Fatalf("server saw %d calls, want 1", n)
			}
		})
	}
}
