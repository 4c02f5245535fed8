package guardgrpc_test

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"strconv"
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
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

// lossy is a server interceptor, outermost, that loses the answer of the
// first call after the handler (and the key's commit) ran: the client sees
// UNAVAILABLE, as when a connection is cut on the way back.
func lossy() grpc.UnaryServerInterceptor {
	var n atomic.Int64
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if n.Add(1) == 1 {
			return nil, status.Error(codes.Unavailable, "answer lost on the way back")
		}
		return resp, err
	}
}

// charging is a Health service whose Check "charges" once per run.
func charging() *health {
	h := &health{}
	h.check = func(_ context.Context, _ int64, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	return h
}

func keyServer(t testing.TB, store idempotency.Store, h *health, extra ...grpc.UnaryServerInterceptor) healthpb.HealthClient {
	t.Helper()
	return keyServerCfg(t, guardgrpc.KeyConfig{Store: store, SingleTenant: true}, h, extra...)
}

// keyServerCfg serves h behind the extra interceptors (outermost first)
// and a guardgrpc Server with keys, and returns a guarded client of it.
func keyServerCfg(t testing.TB, kc guardgrpc.KeyConfig, h *health, extra ...grpc.UnaryServerInterceptor) healthpb.HealthClient {
	t.Helper()
	if kc.Logger == nil {
		kc.Logger = slog.New(slog.DiscardHandler)
	}
	srv := newServer(t, guardgrpc.ServerConfig{Keys: &kc})
	chain := append(extra, srv.UnaryServerInterceptor())
	return dial(t, serve(t, h, grpc.ChainUnaryInterceptor(chain...)), newClient(t, guardgrpc.ClientConfig{Retry: guardrail.Retry{MaxRetryAfter: -1}}))
}

func withKey(t testing.TB, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctxTimeout(t, 10*time.Second), guardgrpc.MDIdempotencyKey, key)
}

func testLostAnswerChargesOnce(t *testing.T, store idempotency.Store) {
	h := charging()
	cl := keyServer(t, store, h, lossy())
	var header metadata.MD
	resp, err := cl.Check(withKey(t, "pay-"+strconv.FormatInt(time.Now().UnixNano(), 10)), &healthpb.HealthCheckRequest{Service: "order-1"}, grpc.Header(&header))
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("replayed answer %v, want the stored SERVING", resp)
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want once: the retry must get the stored answer", got)
	}
	if got := header.Get(idempotency.HeaderReplayed); len(got) != 1 || got[0] != "true" {
		t.Fatalf("header %v, want %s: true", header, idempotency.HeaderReplayed)
	}
}

func TestLostAnswerChargesOnceMemstore(t *testing.T) {
	testLostAnswerChargesOnce(t, newMemstore(t))
}

func TestKeyMismatchConflictAndRelease(t *testing.T) {
	store := newMemstore(t)
	t.Run("mismatch", func(t *testing.T) {
		h := charging()
		cl := keyServer(t, store, h)
		if _, err := cl.Check(withKey(t, "m"), &healthpb.HealthCheckRequest{Service: "a"}); err != nil {
			t.Fatal(err)
		}
		_, err := cl.Check(withKey(t, "m"), &healthpb.HealthCheckRequest{Service: "b"})
		if status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("same key, other request: %v, want FAILED_PRECONDITION", err)
		}
		if got := h.calls.Load(); got != 1 {
			t.Fatalf("handler ran %d times, want 1", got)
		}
	})
	t.Run("conflict", func(t *testing.T) {
		gate := make(chan struct{})
		in := make(chan struct{})
		h := &health{check: func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
			close(in)
			<-gate
			return serving, nil
		}}
		cl := keyServer(t, store, h)
		done := make(chan error)
		go func() {
			_, err := cl.Check(withKey(t, "c"), &healthpb.HealthCheckRequest{})
			done <- err
		}()
		<-in
		var trailer metadata.MD
		_, err := cl.Check(withKey(t, "c"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
		close(gate)
		if status.Code(err) != codes.Aborted || len(trailer.Get(guardgrpc.MDPushback)) != 1 {
			t.Fatalf("same key in flight: %v, trailer %v; want ABORTED with a pushback", err, trailer)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("server error releases, client error is stored", func(t *testing.T) {
		h := &health{check: func(_ context.Context, n int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
			if n == 1 {
				return nil, status.Error(codes.Internal, "bug")
			}
			return nil, status.Error(codes.NotFound, "no such service")
		}}
		cl := keyServer(t, store, h)
		for i, want := range []codes.Code{codes.Internal, codes.NotFound, codes.NotFound} {
			_, err := cl.Check(withKey(t, "r"), &healthpb.HealthCheckRequest{})
			if status.Code(err) != want {
				t.Fatalf("call %d: %v, want %v", i+1, err, want)
			}
		}
		if got := h.calls.Load(); got != 2 {
			t.Fatalf("handler ran %d times, want 2: INTERNAL releases, NOT_FOUND is replayed", got)
		}
	})
	t.Run("malformed key", func(t *testing.T) {
		cl := keyServer(t, store, charging())
		_, err := cl.Check(withKey(t, "a,b"), &healthpb.HealthCheckRequest{})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("malformed key: %v, want INVALID_ARGUMENT", err)
		}
	})
}

// failingStore fails every call.
type failingStore struct{ idempotency.Store }

func (failingStore) Begin(context.Context, string, idempotency.Fingerprint, time.Duration) (idempotency.Result, error) {
	return idempotency.Result{}, errors.New("store down")
}

func TestKeyStoreFailure(t *testing.T) {
	h := charging()
	cl := keyServer(t, failingStore{}, h)
	var trailer metadata.MD
	_, err := cl.Check(withKey(t, "s"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.Unavailable || len(trailer.Get(guardgrpc.MDPushback)) != 1 {
		t.Fatalf("store down: %v, trailer %v; want UNAVAILABLE with a pushback", err, trailer)
	}
	if h.calls.Load() != 0 {
		t.Fatal("handler ran unprotected without FailOpen")
	}
}

func newMemstore(t testing.TB) *memstore.Store {
	t.Helper()
	s, err := memstore.New(memstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// extendSignal passes calls to a store and sends on extended after each
// Extend that succeeded.
type extendSignal struct {
	idempotency.Store
	extended chan struct{}
}

func (e *extendSignal) Extend(ctx context.Context, key, token string, lease time.Duration) error {
	err := e.Store.Extend(ctx, key, token, lease)
	if err == nil {
		select {
		case e.extended <- struct{}{}:
		default:
		}
	}
	return err
}

func TestLeaseRenewedWhileHandlerRuns(t *testing.T) {
	// Renewed every third of the lease: a renewal may be late by two thirds
	// (667 ms) before the lock lapses, which a busy machine under the race
	// detector needs; 60 and 300 ms lapsed there.
	const lease = time.Second
	gate := make(chan struct{})
	in := make(chan struct{}, 1)
	h := &health{check: func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		in <- struct{}{}
		<-gate
		return serving, nil
	}}
	store := &extendSignal{Store: newMemstore(t), extended: make(chan struct{}, 1)}
	srv := newServer(t, guardgrpc.ServerConfig{MaxTimeout: -1, Keys: &guardgrpc.KeyConfig{Store: store, SingleTenant: true, Lease: lease, Logger: slog.New(slog.DiscardHandler)}})
	cl := dial(t, serve(t, h, grpc.UnaryInterceptor(srv.UnaryServerInterceptor())), nil)
	done := make(chan error)
	go func() {
		// No deadline: the lease alone protects the key.
		_, err := cl.Check(metadata.AppendToOutgoingContext(context.Background(), guardgrpc.MDIdempotencyKey, "slow"), &healthpb.HealthCheckRequest{})
		done <- err
	}()
	<-in
	// Three renewals, a third of the lease apart: the third comes a whole
	// lease after the lock, which only renewal holds by then.
	for range 3 {
		<-store.extended
	}
	_, err := cl.Check(metadata.AppendToOutgoingContext(ctxTimeout(t, 5*time.Second), guardgrpc.MDIdempotencyKey, "slow"), &healthpb.HealthCheckRequest{})
	close(gate)
	if status.Code(err) != codes.Aborted {
		t.Fatalf("same key after three renewals of a running handler: %v, want ABORTED (the lease is renewed)", err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := h.calls.Load(); got != 1 {
		t.Fatalf("handler ran %d times, want 1", got)
	}
}

// bareKeyServer serves h behind a guardgrpc Server with keys configured
// by kc, and returns a plain client of it: no retries, so that every call
// the test makes is one call, and the handler's count is exact. Calls
// keep the deadline they have: none, and their lease is kc.Lease.
func bareKeyServer(t *testing.T, kc guardgrpc.KeyConfig, obs event.Observer, h *health) healthpb.HealthClient {
	t.Helper()
	if kc.Logger == nil {
		kc.Logger = slog.New(slog.DiscardHandler)
	}
	kc.SingleTenant = true
	srv := newServer(t, guardgrpc.ServerConfig{Keys: &kc, Observer: obs, MaxTimeout: -1})
	return dial(t, serve(t, h, grpc.UnaryInterceptor(srv.UnaryServerInterceptor())), nil)
}

// The gRPC half of the one table of stored and released answers: each
// code is answered once, then the same call with the same key is sent
// again. A stored answer is replayed without the handler running; a
// released one lets the retry reach the handler, which then succeeds.
func TestAnswerTable(t *testing.T) {
	tests := []struct {
		code   codes.Code
		stored bool
	}{
		{codes.InvalidArgument, true},
		{codes.FailedPrecondition, true},
		{codes.OutOfRange, true},
		{codes.Unauthenticated, true},
		{codes.PermissionDenied, true},
		{codes.NotFound, true},
		{codes.AlreadyExists, true},
		{codes.Canceled, true}, // by the handler, its client still there
		{codes.ResourceExhausted, false},
		{codes.Unavailable, false},
		{codes.Aborted, false},
		{codes.DeadlineExceeded, false},
		{codes.Unimplemented, false},
		{codes.Unknown, false},
		{codes.Internal, false},
		{codes.DataLoss, false},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			h := &health{check: func(_ context.Context, n int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
				if n == 1 {
					return nil, status.Error(tt.code, "first answer")
				}
				return serving, nil
			}}
			cl := bareKeyServer(t, guardgrpc.KeyConfig{Store: newMemstore(t)}, nil, h)
			_, err := cl.Check(withKey(t, "k"), &healthpb.HealthCheckRequest{})
			if status.Code(err) != tt.code {
				t.Fatalf("first call: %v, want %v", err, tt.code)
			}
			var header metadata.MD
			_, err = cl.Check(withKey(t, "k"), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
			replayed := len(header.Get(idempotency.HeaderReplayed)) == 1
			switch {
			case tt.stored && (status.Code(err) != tt.code || !replayed):
				t.Errorf("retry: %v (replayed %v), want %v replayed", err, replayed, tt.code)
			case !tt.stored && (err != nil || replayed):
				t.Errorf("retry: %v (replayed %v), want it run and succeed", err, replayed)
			}
			want := int64(2)
			if tt.stored {
				want = 1
			}
			if got := h.calls.Load(); got != want {
				t.Errorf("handler ran %d times, want %d", got, want)
			}
		})
	}
}

// RESOURCE_EXHAUSTED with a pushback is gRPC's 429 with Retry-After: the
// call was not processed, so its key is released and the retry with the
// same key reaches the handler again.
func TestResourceExhaustedReleasesTheKey(t *testing.T) {
	h := &health{check: func(ctx context.Context, n int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		if n == 1 {
			grpc.SetTrailer(ctx, metadata.Pairs(guardgrpc.MDPushback, "3000"))
			return nil, status.Error(codes.ResourceExhausted, "quota exceeded")
		}
		return serving, nil
	}}
	ev := &keyEvents{}
	cl := bareKeyServer(t, guardgrpc.KeyConfig{Store: newMemstore(t)}, ev, h)
	var trailer metadata.MD
	_, err := cl.Check(withKey(t, "q"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted || len(trailer.Get(guardgrpc.MDPushback)) != 1 {
		t.Fatalf("first call: %v, trailer %v; want RESOURCE_EXHAUSTED with the handler's pushback", err, trailer)
	}
	if _, err := cl.Check(withKey(t, "q"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("retry with the same key: %v, want it run and succeed", err)
	}
	var header metadata.MD
	if _, err := cl.Check(withKey(t, "q"), &healthpb.HealthCheckRequest{}, grpc.Header(&header)); err != nil || len(header.Get(idempotency.HeaderReplayed)) != 1 {
		t.Fatalf("third call: %v, header %v; want the stored success replayed", err, header)
	}
	if got := h.calls.Load(); got != 2 {
		t.Errorf("handler ran %d times, want 2: once refused, once served", got)
	}
	if ev.count(event.ReasonReleased) != 1 || ev.count(event.ReasonStored) != 1 || ev.count(event.ReasonReplayed) != 1 {
		t.Errorf("events %v, want one released, one stored, one replayed", ev.reasons())
	}
}

// lostOnRelease is a store on which every Release finds the lock lost, as
// when the lease ended and a retry took the key over.
type lostOnRelease struct{ *memstore.Store }

func (lostOnRelease) Release(context.Context, string, string) error { return idempotency.ErrLockLost }

// Releasing a key that is no longer the call's is benign: the key is
// someone else's, or expired. The handler's answer goes back unchanged,
// the log says so, and no store_error is emitted, as over HTTP.
func TestReleaseOfALostKeyIsNotAStoreError(t *testing.T) {
	h := &health{check: func(context.Context, int64, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		return nil, status.Error(codes.Unavailable, "database down")
	}}
	var logs lockedLog
	ev := &keyEvents{}
	cl := bareKeyServer(t, guardgrpc.KeyConfig{Store: lostOnRelease{newMemstore(t)}, Logger: slog.New(slog.NewTextHandler(&logs, nil))}, ev, h)
	_, err := cl.Check(withKey(t, "l"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable || status.Convert(err).Message() != "database down" {
		t.Fatalf("answer %v, want the handler's UNAVAILABLE", err)
	}
	if n := ev.count(event.ReasonStoreError); n != 0 {
		t.Errorf("%d store_error events, want none", n)
	}
	if s := logs.String(); !strings.Contains(s, "no longer held when releasing it") || !strings.Contains(s, "level=WARN") || strings.Contains(s, "level=ERROR") {
		t.Errorf("log: %s", s)
	}
}

// keyEvents counts idempotency events by reason.
type keyEvents struct {
	mu sync.Mutex
	n  map[string]int
}

func (e *keyEvents) Observe(ctx context.Context, ev event.Event) context.Context {
	if ev.Kind != event.Idempotency {
		return ctx
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.n == nil {
		e.n = map[string]int{}
	}
	e.n[ev.Reason]++
	return ctx
}

func (e *keyEvents) count(reason string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n[reason]
}

func (e *keyEvents) reasons() map[string]int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return maps.Clone(e.n)
}

// lockedLog is a log destination safe for concurrent writers.
type lockedLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// A handler behind the interceptor holds its key as one behind the HTTP
// middleware does: Held and Confirm say so, and say the lease is lost
// once the handler has returned; a call without a key is unprotected.
func TestHeldAndConfirmInAHandler(t *testing.T) {
	var handlerCtx context.Context
	var held, confirmed error
	h := &health{check: func(ctx context.Context, _ int64, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		handlerCtx = ctx
		held, confirmed = idempotency.Held(ctx), idempotency.Confirm(ctx)
		return serving, nil
	}}
	cl := bareKeyServer(t, guardgrpc.KeyConfig{Store: newMemstore(t)}, nil, h)
	if _, err := cl.Check(withKey(t, "held"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if held != nil || confirmed != nil {
		t.Fatalf("in the handler: Held %v, Confirm %v; want nil", held, confirmed)
	}
	if err := idempotency.Held(handlerCtx); !errors.Is(err, idempotency.ErrLeaseLost) {
		t.Errorf("Held after the handler returned: %v, want ErrLeaseLost", err)
	}
	if _, err := cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if held != nil || confirmed != nil {
		t.Errorf("without a key: Held %v, Confirm %v; want nil (unprotected)", held, confirmed)
	}
}

func TestKeyConfigReportsEveryInvalidField(t *testing.T) {
	_, err := guardgrpc.NewServer(guardgrpc.ServerConfig{Keys: &guardgrpc.KeyConfig{
		Store: newMemstore(t), SingleTenant: true, TTL: -1, Lease: -1, StoreTimeout: -1, RetryAfter: -1, MaxKeyLength: -1,
	}})
	if !errors.Is(err, guardgrpc.ErrInvalidConfig) {
		t.Fatalf("NewServer: %v, want ErrInvalidConfig", err)
	}
	for _, want := range []string{"KeyConfig.TTL", "KeyConfig.Lease", "KeyConfig.StoreTimeout", "KeyConfig.RetryAfter", "KeyConfig.MaxKeyLength"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %s", err, want)
		}
	}
}

// lostOnExtend is a store on which every renewal finds the lock lost.
type lostOnExtend struct{ *memstore.Store }

func (lostOnExtend) Extend(context.Context, string, string, time.Duration) error {
	return idempotency.ErrLockLost
}

// With CancelOnLeaseLost, a renewal that finds the lock lost cancels the
// handler's context, with ErrLeaseLost as the cause; the handler, which
// gives up without an answer, has nothing stored.
func TestCancelOnLeaseLost(t *testing.T) {
	var cause error
	h := &health{check: func(ctx context.Context, _ int64, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
		<-ctx.Done() // the first renewal, a third of the lease in, finds the lock lost
		cause = context.Cause(ctx)
		return nil, status.Error(codes.Unavailable, "gave up: lease lost")
	}}
	cl := bareKeyServer(t, guardgrpc.KeyConfig{Store: lostOnExtend{newMemstore(t)}, Lease: 30 * time.Millisecond, CancelOnLeaseLost: true}, nil, h)
	// No deadline, which would make the lease the deadline plus a second.
	_, err := cl.Check(metadata.AppendToOutgoingContext(context.Background(), guardgrpc.MDIdempotencyKey, "cancel"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("answer %v, want the handler's UNAVAILABLE", err)
	}
	if !errors.Is(cause, idempotency.ErrLeaseLost) || !errors.Is(cause, idempotency.ErrLockLost) {
		t.Errorf("context cause %v, want ErrLeaseLost and ErrLockLost", cause)
	}
}

// One caller at its quota of live keys gets RESOURCE_EXHAUSTED with a
// pushback for a new key, even with FailOpen, without its handler
// running; its live keys are still answered, and another caller is
// unaffected.
func TestScopeQuota(t *testing.T) {
	h := charging()
	caller := func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		return md.Get("caller")[0], nil
	}
	cl := keyServerCfg(t, guardgrpc.KeyConfig{Store: newMemstore(t), Scope: caller, MaxKeysPerScope: 2, FailOpen: true}, h)
	call := func(who, key string) (codes.Code, metadata.MD) {
		var tr metadata.MD
		ctx := metadata.AppendToOutgoingContext(withKey(t, key), "caller", who)
		_, err := cl.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Trailer(&tr))
		return status.Code(err), tr
	}
	for _, k := range []string{"a1", "a2"} {
		if code, _ := call("alice", k); code != codes.OK {
			t.Fatalf("alice's key %s: %v", k, code)
		}
	}
	code, tr := call("alice", "a3")
	if code != codes.ResourceExhausted || len(tr.Get(guardgrpc.MDPushback)) != 1 {
		t.Fatalf("alice's third key: %v, trailer %v; want RESOURCE_EXHAUSTED with a pushback", code, tr)
	}
	if code, _ := call("alice", "a1"); code != codes.OK {
		t.Fatalf("alice's retry of a live key: %v, want its stored answer", code)
	}
	if code, _ := call("bob", "b1"); code != codes.OK {
		t.Fatalf("bob's first key: %v, want OK: alice's quota is hers", code)
	}
	if got := h.calls.Load(); got != 3 {
		t.Fatalf("handler ran %d times, want 3 (a1, a2, b1)", got)
	}
}
