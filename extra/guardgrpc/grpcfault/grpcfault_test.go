package grpcfault_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
	"github.com/guardrail-go/guardrail/extra/guardgrpc/grpcfault"
	"github.com/guardrail-go/guardrail/fault"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	checkMethod = "/grpc.health.v1.Health/Check"
	watchMethod = "/grpc.health.v1.Health/Watch"
)

// health counts the calls that reach it; Watch sends two answers.
type health struct {
	healthpb.UnimplementedHealthServer
	calls atomic.Int64
}

var serving = &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}

func (h *health) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	h.calls.Add(1)
	return serving, nil
}

func (h *health) Watch(_ *healthpb.HealthCheckRequest, s healthpb.Health_WatchServer) error {
	h.calls.Add(1)
	if err := s.Send(serving); err != nil {
		return err
	}
	return s.Send(serving)
}

// newInjector returns an Injector with rules, closed at the end of the test.
func newInjector(t testing.TB, rules ...fault.Rule) *fault.Injector {
	t.Helper()
	in, err := fault.New(fault.Config{Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	return in
}

// serve starts a gRPC server for h on an in-memory listener, with the
// server interceptors of server (nil for none), and returns a client
// connection to it with the client interceptors of client (nil for none).
func serve(t testing.TB, h *health, server, client *fault.Injector, dial ...grpc.DialOption) healthpb.HealthClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	var sopts []grpc.ServerOption
	if server != nil {
		sopts = append(sopts, grpc.ChainUnaryInterceptor(grpcfault.UnaryServerInterceptor(server)),
			grpc.ChainStreamInterceptor(grpcfault.StreamServerInterceptor(server)))
	}
	srv := grpc.NewServer(sopts...)
	healthpb.RegisterHealthServer(srv, h)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	copts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) })}
	copts = append(copts, dial...) // outside the fault interceptors
	if client != nil {
		copts = append(copts, grpc.WithChainUnaryInterceptor(grpcfault.UnaryClientInterceptor(client)),
			grpc.WithChainStreamInterceptor(grpcfault.StreamClientInterceptor(client)))
	}
	cc, err := grpc.NewClient("passthrough:///pricing.internal:50051", copts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cc.Close()
		srv.Stop()
		<-done
	})
	return healthpb.NewHealthClient(cc)
}

// faultCases are the faults of a unary call, on either side: the code and
// the message the caller gets, and how many calls the service saw.
var faultCases = []struct {
	name     string
	fault    fault.Fault
	code     codes.Code
	msg      string
	calls    int64
	pushback string
}{
	{"status 429 as the spec maps it", fault.Status{Code: 429}, codes.Unavailable, "injected status 429", 0, ""},
	{"status 404", fault.Status{Code: 404}, codes.Unimplemented, "injected status 404", 0, ""},
	{"status 500", fault.Status{Code: 500}, codes.Unknown, "injected status 500", 0, ""},
	{"default status", fault.Status{}, codes.Unavailable, "injected status 503", 0, ""},
	{"grpc code with pushback", fault.Status{GRPCCode: "RESOURCE_EXHAUSTED", RetryAfter: 1500*time.Millisecond + 1}, codes.ResourceExhausted, "RESOURCE_EXHAUSTED", 0, "1501"},
	{"reset", fault.Reset{}, codes.Unavailable, "connection reset", 0, ""},
	{"refuse", fault.Refuse{}, codes.Unavailable, "connection refused", 0, ""},
	{"lose response", fault.LoseResponse{}, codes.Unavailable, "response lost", 1, ""},
	{"slow body passes", fault.SlowBody{}, codes.OK, "", 1, ""},
	{"truncate passes", fault.Truncate{}, codes.OK, "", 1, ""},
}

func TestUnaryServerFaults(t *testing.T) {
	for _, tt := range faultCases {
		t.Run(tt.name, func(t *testing.T) {
			h := &health{}
			in := newInjector(t, fault.Rule{Match: fault.Match{Methods: []string{"POST"}, Path: "/grpc.health.v1.Health/*",
				Host: "pricing.internal:*"}, Fault: tt.fault})
			c := serve(t, h, in, nil)
			var trailer metadata.MD
			_, err := c.Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
			checkStatus(t, err, tt.code, tt.msg)
			if got := h.calls.Load(); got != tt.calls {
				t.Errorf("the service saw %d calls; want %d", got, tt.calls)
			}
			if got := strings.Join(trailer.Get("grpc-retry-pushback-ms"), ","); got != tt.pushback {
				t.Errorf("pushback trailer %q; want %q", got, tt.pushback)
			}
			if cs := in.Counters(); cs[0].Matched != 1 || cs[0].Fired != 1 {
				t.Errorf("counters %+v; want matched 1, fired 1", cs)
			}
		})
	}
}

func TestUnaryClientFaults(t *testing.T) {
	for _, tt := range faultCases {
		t.Run(tt.name, func(t *testing.T) {
			h := &health{}
			in := newInjector(t, fault.Rule{Match: fault.Match{Path: checkMethod, Host: "pricing.internal:50051"}, Fault: tt.fault})
			c := serve(t, h, nil, in)
			var trailer metadata.MD
			_, err := c.Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
			checkStatus(t, err, tt.code, tt.msg)
			if got := h.calls.Load(); got != tt.calls {
				t.Errorf("the service saw %d calls; want %d", got, tt.calls)
			}
			if got := strings.Join(trailer.Get("grpc-retry-pushback-ms"), ","); got != tt.pushback {
				t.Errorf("pushback trailer %q; want %q", got, tt.pushback)
			}
			if tt.pushback != "" {
				if d := guardrail.DefaultClassify(err).RetryAfter; d != 1500*time.Millisecond+1 {
					t.Errorf("RetryAfter %v for guardrail; want the rule's", d)
				}
			}
		})
	}
}

func checkStatus(t *testing.T, err error, code codes.Code, msg string) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || !strings.Contains(st.Message(), msg) {
		t.Errorf("got %v; want %v with %q", err, code, msg)
	}
}

// Streams get the fault once, when they start; a lost response runs the
// handler and drops what it sends.
func TestStreamFaults(t *testing.T) {
	for _, side := range []string{"server", "client"} {
		for _, tt := range []struct {
			name     string
			fault    fault.Fault
			code     codes.Code
			calls    int64
			pushback string
		}{
			{"status with pushback", fault.Status{Code: 503, RetryAfter: 2 * time.Second}, codes.Unavailable, 0, "2000"},
			{"reset", fault.Reset{}, codes.Unavailable, 0, ""},
			{"lose response", fault.LoseResponse{}, codes.Unavailable, 1, ""},
			{"stall body passes", fault.StallBody{}, codes.OK, 1, ""},
		} {
			t.Run(side+"/"+tt.name, func(t *testing.T) {
				h := &health{}
				in := newInjector(t, fault.Rule{Match: fault.Match{Path: watchMethod}, Fault: tt.fault})
				var c healthpb.HealthClient
				if side == "server" {
					c = serve(t, h, in, nil)
				} else {
					c = serve(t, h, nil, in)
				}
				var trailer metadata.MD
				got := 0
				s, err := c.Watch(t.Context(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
				for err == nil {
					if _, err = s.Recv(); err == nil {
						got++
					}
				}
				if err == io.EOF {
					err = nil
				}
				if status.Code(err) != tt.code {
					t.Errorf("got %v; want %v", err, tt.code)
				}
				if want := map[bool]int{true: 2}[tt.code == codes.OK]; got != want {
					t.Errorf("received %d messages; want %d", got, want)
				}
				if n := h.calls.Load(); n != tt.calls {
					t.Errorf("the service saw %d streams; want %d", n, tt.calls)
				}
				if got := strings.Join(trailer.Get("grpc-retry-pushback-ms"), ","); got != tt.pushback {
					t.Errorf("pushback trailer %q; want %q", got, tt.pushback)
				}
			})
		}
	}
}

// Rules match metadata (lower-case keys) as headers, and a call that no
// rule matches passes.
func TestMatchMetadata(t *testing.T) {
	for _, side := range []string{"server", "client"} {
		t.Run(side, func(t *testing.T) {
			h := &health{}
			in := newInjector(t, fault.Rule{Match: fault.Match{Headers: map[string]string{"X-Tenant": "canary-*"}}, Fault: fault.Reset{}})
			var c healthpb.HealthClient
			if side == "server" {
				c = serve(t, h, in, nil)
			} else {
				c = serve(t, h, nil, in)
			}
			ctx := metadata.AppendToOutgoingContext(t.Context(), "x-tenant", "canary-3")
			if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
				t.Errorf("canary: %v; want UNAVAILABLE", err)
			}
			ctx = metadata.AppendToOutgoingContext(t.Context(), "x-tenant", "prod")
			if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
				t.Errorf("prod: %v; want it through", err)
			}
			if n := h.calls.Load(); n != 1 {
				t.Errorf("the service saw %d calls; want 1", n)
			}
		})
	}
}

// End to end: an Injector with no rules serves; a rule file PUT through the
// admin endpoint gives the next call its fault, and the counters say so.
func TestAdminReconfigure(t *testing.T) {
	h := &health{}
	in := newInjector(t)
	c := serve(t, h, in, nil)
	if _, err := c.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("before the rules: %v", err)
	}
	adm, err := in.Admin(fault.AdminConfig{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(adm)
	defer srv.Close()
	rules := `{"rules":[{"name":"pricing-overload","match":{"path":"/grpc.health.v1.Health/Check"},
		"kind":"error","grpc_code":"resource_exhausted","retry_after":"2s"}]}`
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, srv.URL+"/rules", strings.NewReader(rules))
	req.Header.Set("Content-Type", "application/json")
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("PUT /rules: %d %s", resp.StatusCode, body)
	}
	var trailer metadata.MD
	_, err = c.Check(t.Context(), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted || strings.Join(trailer.Get("grpc-retry-pushback-ms"), "") != "2000" {
		t.Errorf("after the PUT: %v, trailer %v; want RESOURCE_EXHAUSTED with pushback 2000", err, trailer)
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("the service saw %d calls; want 1 (before the rules)", n)
	}
	if cs := in.Counters(); len(cs) != 1 || cs[0].Rule != "pricing-overload" || cs[0].Fired != 1 {
		t.Errorf("counters %+v; want pricing-overload fired once", cs)
	}
	if !bytes.Contains(body, []byte(`"grpc_code": "RESOURCE_EXHAUSTED"`)) {
		t.Errorf("admin answer %s does not show the grpc_code", body)
	}
}

// A header fault comes from the x-fault metadata key when header faults
// are on; a malformed one answers INVALID_ARGUMENT.
func TestHeaderFault(t *testing.T) {
	h := &health{}
	in, err := fault.New(fault.Config{HeaderFaults: true})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	c := serve(t, h, in, nil)
	ctx := metadata.AppendToOutgoingContext(t.Context(), "x-fault", "error; grpc_code=ABORTED")
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Aborted {
		t.Errorf("header fault: %v; want ABORTED", err)
	}
	ctx = metadata.AppendToOutgoingContext(t.Context(), "x-fault", "nonsense")
	if _, err := c.Check(ctx, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.InvalidArgument {
		t.Errorf("bad header fault: %v; want INVALID_ARGUMENT", err)
	}
	if n := h.calls.Load(); n != 0 {
		t.Errorf("the service saw %d calls; want 0", n)
	}
}

// Timing, on the interceptors called directly: latency waits before the
// handler, and a deadline cuts it short; a hang lasts until the deadline;
// Close releases it.
func TestLatencyAndHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := newInjector(t,
			fault.Rule{Match: fault.Match{Path: "/svc.S/Slow"}, Fault: fault.Latency{Delay: 2 * time.Second}},
			fault.Rule{Match: fault.Match{Path: "/svc.S/Hang"}, Fault: fault.Hang{}})
		server := grpcfault.UnaryServerInterceptor(in)
		client := grpcfault.UnaryClientInterceptor(in)
		var runs atomic.Int32
		handler := func(context.Context, any) (any, error) { runs.Add(1); return "ok", nil }
		invoker := func(context.Context, string, any, any, *grpc.ClientConn, ...grpc.CallOption) error {
			runs.Add(1)
			return nil
		}
		call := func(ctx context.Context, side, method string) error {
			if side == "server" {
				_, err := server(ctx, nil, &grpc.UnaryServerInfo{FullMethod: method}, handler)
				return err
			}
			return client(ctx, method, nil, nil, nil, invoker)
		}
		for _, side := range []string{"server", "client"} {
			runs.Store(0)
			start := time.Now()
			if err := call(t.Context(), side, "/svc.S/Slow"); err != nil || time.Since(start) != 2*time.Second || runs.Load() != 1 {
				t.Errorf("%s latency: %v after %v, %d runs; want nil after 2s, 1 run", side, err, time.Since(start), runs.Load())
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Second)
			start = time.Now()
			if err := call(ctx, side, "/svc.S/Slow"); status.Code(err) != codes.DeadlineExceeded || time.Since(start) != time.Second {
				t.Errorf("%s latency past the deadline: %v after %v; want DEADLINE_EXCEEDED after 1s", side, err, time.Since(start))
			}
			cancel()
			ctx, cancel = context.WithTimeout(t.Context(), 30*time.Second)
			start = time.Now()
			if err := call(ctx, side, "/svc.S/Hang"); status.Code(err) != codes.DeadlineExceeded || time.Since(start) != 30*time.Second {
				t.Errorf("%s hang: %v after %v; want DEADLINE_EXCEEDED after 30s", side, err, time.Since(start))
			}
			cancel()
			if runs.Load() != 1 {
				t.Errorf("%s: %d runs; want 1", side, runs.Load())
			}
		}
		done := make(chan error)
		go func() { done <- call(t.Context(), "server", "/svc.S/Hang") }()
		synctest.Wait()
		in.Close()
		if err := <-done; status.Code(err) != codes.Unavailable {
			t.Errorf("hang after Close: %v; want UNAVAILABLE", err)
		}
	})
}

// Under guardgrpc's client, an injected pushback is honoured as a server's
// (the retry waits it, and succeeds), and a lost answer of a method that is
// not idempotent is not retried: the server saw it once.
func TestUnderGuardgrpcClient(t *testing.T) {
	var draws atomic.Int32
	in, err := fault.New(fault.Config{
		Rules: []fault.Rule{
			{Name: "overload", Probability: 0.5, Match: fault.Match{Path: checkMethod},
				Fault: fault.Status{GRPCCode: "RESOURCE_EXHAUSTED", RetryAfter: 30 * time.Millisecond}},
			{Name: "lost", Match: fault.Match{Path: watchMethod}, Fault: fault.LoseResponse{}},
		},
		// The overload rule fires on the first call only.
		Rand: func() float64 { return map[bool]float64{true: 0.1, false: 0.9}[draws.Add(1) == 1] },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	gc, err := guardgrpc.NewClient(guardgrpc.ClientConfig{IdempotentMethods: []string{checkMethod},
		Retry: guardrail.Retry{Backoff: backoff.Constant(time.Millisecond)}})
	if err != nil {
		t.Fatal(err)
	}
	h := &health{}
	c := serve(t, h, nil, in, gc.DialOptions()...)
	start := time.Now()
	if _, err := c.Check(t.Context(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("Check: %v; want the retry after the pushback to succeed", err)
	}
	if d := time.Since(start); d < 30*time.Millisecond {
		t.Errorf("succeeded after %v; want the 30ms pushback waited", d)
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("the service saw %d calls; want 1 (the retry)", n)
	}
	s, err := c.Watch(t.Context(), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = s.Recv()
	}
	if status.Code(err) != codes.Unavailable || h.calls.Load() != 2 {
		t.Errorf("lost stream answer: %v with %d calls; want UNAVAILABLE, the stream run once", err, h.calls.Load()-1)
	}
}

// A call that gets no fault allocates nothing in the server interceptor:
// the :authority and the metadata are looked up (and copied) only for a
// rule whose method and path hold.
func TestPassThroughAllocs(t *testing.T) {
	in := newInjector(t, fault.Rule{Match: fault.Match{Path: "/orders.v1.Orders/**", Host: "orders.*"}, Fault: fault.Status{}})
	icpt := grpcfault.UnaryServerInterceptor(in)
	ctx := metadata.NewIncomingContext(t.Context(), metadata.Pairs(":authority", "pricing.internal:50051", "x-tenant", "prod"))
	info := &grpc.UnaryServerInfo{FullMethod: "/pricing.v1.Pricing/Quote"}
	handler := func(context.Context, any) (any, error) { return nil, nil }
	if n := testing.AllocsPerRun(100, func() { _, _ = icpt(ctx, nil, info, handler) }); n != 0 {
		t.Errorf("%v allocations per call; want 0", n)
	}
}
