package grpcconfig_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/extra/config"
	"github.com/guardrail-go/guardrail/extra/grpcconfig"
	"github.com/guardrail-go/guardrail/extra/guardgrpc"
)

const testFile = `
defaults:
  max_attempts: 3
  backoff: {strategy: none}
  retry_budget: {ratio: 0.5, max: 100}
dependencies:
  health:
    kind: grpc
    reason: "tests"
    attempt_timeout: 2s
    idempotent_methods: [/grpc.health.v1.Health/Check]
    max_buffered_messages: 8
    failure_domain: method
    breaker: {min_requests: 100, consecutive_failures: 4, open_for: 1m}
    bulkhead: {max_concurrent: 20}
  web:
    reason: "tests"
    max_attempts: 1
`

func unavailable(context.Context, int64) (*healthpb.HealthCheckResponse, error) {
	return nil, status.Error(codes.Unavailable, "down")
}

// The client a file configures is the one built by hand from the same
// numbers: the same ClientConfig, and against a real server the same calls
// seen, the same errors and the same breaker states.
func TestClientEqualsHandBuilt(t *testing.T) {
	reg := newRegistry(t, testFile)
	fromFile, err := grpcconfig.NewClient(reg, "health", grpcconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	got, dl := fromFile.Config()
	if dl != 0 {
		t.Errorf("deadline %v; want none", dl)
	}
	hand := guardgrpc.ClientConfig{
		Name: "health",
		Retry: guardrail.Retry{
			MaxAttempts:    3,
			AttemptTimeout: 2 * time.Second,
			Backoff:        backoff.None(),
		},
		IdempotentMethods:   []string{checkMethod},
		MaxBufferedMessages: 8,
		Key:                 guardgrpc.ByMethod,
		Bulkhead:            &bulkhead.Config{MaxConcurrent: 20},
	}
	if reflect.ValueOf(got.Key).Pointer() != reflect.ValueOf(guardgrpc.ByMethod).Pointer() {
		t.Error("failure_domain: method did not make Key guardgrpc.ByMethod")
	}
	if got.Bulkheads == nil || got.Bulkheads.Get("k").Limit() != 20 || got.Bulkhead != nil {
		t.Errorf("bulkhead: group %v, config %v; want a group of compartments of 20", got.Bulkheads, got.Bulkhead)
	}
	if got.Budget == nil || got.Budget.Max() != 100 || got.Breakers == nil {
		t.Fatalf("budget %v, breakers %v; want the Registry's, max 100", got.Budget, got.Breakers)
	}
	plain, byHand := got, hand
	plain.Budget, plain.Breakers, plain.Bulkheads, plain.Key = nil, nil, nil, nil
	byHand.Key, byHand.Bulkhead = nil, nil
	if !reflect.DeepEqual(plain, byHand) {
		t.Errorf("the file's ClientConfig\n%+v\nis not the one built by hand\n%+v", plain, byHand)
	}
	wantBreaker := breaker.Config{MinRequests: 100, ConsecutiveFailures: 4, OpenFor: time.Minute}
	handBreaker, _ := breaker.New(wantBreaker)
	if g, w := comparable(got.Breakers.Get("x").Config()), comparable(handBreaker.Config()); g != w {
		t.Errorf("breaker settings %s; by hand %s", g, w)
	}

	// Behaviour: two servers failing every call, one per client.
	hand.Budget, _ = budget.New(budget.Config{Ratio: 0.5, Max: 100})
	hand.Breakers, _ = breaker.NewGroup(breaker.GroupConfig{Config: wantBreaker})
	handClient, err := guardgrpc.NewClient(hand)
	if err != nil {
		t.Fatal(err)
	}
	type step struct {
		seen  int64
		code  codes.Code
		open  bool
		state string
	}
	var traces [2][]step
	for i, c := range []struct {
		client   *guardgrpc.Client
		installs func(addr string) healthpb.HealthClient
	}{
		{fromFile.Current(), func(addr string) healthpb.HealthClient { return dial(t, addr, fromFile.DialOptions()) }},
		{handClient, func(addr string) healthpb.HealthClient { return dial(t, addr, handClient.DialOptions()) }},
	} {
		h := &health{}
		h.script(unavailable)
		addr := serve(t, h)
		cl := c.installs(addr)
		key := "passthrough:///" + addr + checkMethod
		for range 4 {
			before := h.calls.Load()
			_, err := cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
			traces[i] = append(traces[i], step{h.calls.Load() - before, status.Code(err), errors.Is(err, guardrail.ErrCircuitOpen), c.client.Breakers().Get(key).State().String()})
		}
	}
	if fmt.Sprint(traces[0]) != fmt.Sprint(traces[1]) {
		t.Errorf("calls seen, codes and breaker states per call:\nfrom the file %v\nby hand       %v", traces[0], traces[1])
	}
	// And what they are: 3 attempts; then the fourth failure in a row
	// opens the breaker, which stops that call's retries and refuses the
	// calls after it without sending them.
	want := []step{{3, codes.Unavailable, false, "closed"}, {1, codes.Unavailable, true, "open"}, {0, codes.Unavailable, true, "open"}, {0, codes.Unavailable, true, "open"}}
	if fmt.Sprint(traces[0]) != fmt.Sprint(want) {
		t.Errorf("trace %v; want %v", traces[0], want)
	}
}

// comparable renders a breaker.Config without its name and functions.
func comparable(c breaker.Config) string {
	c.Name, c.Observer, c.Rand, c.Classify = "", nil, nil, nil
	return fmt.Sprintf("%+v", c)
}

func TestNewClientOfUnknownName(t *testing.T) {
	reg := newRegistry(t, testFile)
	for _, name := range []string{"nope", "web"} {
		if _, err := grpcconfig.NewClient(reg, name, grpcconfig.Options{}); !errors.Is(err, config.ErrUnknown) {
			t.Errorf("NewClient(%q) = %v; want ErrUnknown", name, err)
		}
	}
}

// What the config package refuses for a gRPC dependency covers what
// guardgrpc.NewClient refuses, so that a file that checks always builds,
// on load and on every reload.
func TestFileRefusesWhatNewClientRefuses(t *testing.T) {
	for _, tc := range []struct {
		old, new string
		cfg      guardgrpc.ClientConfig
	}{
		{"attempt_timeout: 2s", "max_attempts: -1", guardgrpc.ClientConfig{Retry: guardrail.Retry{MaxAttempts: -1}}},
		{"attempt_timeout: 2s", "attempt_timeout: -1s", guardgrpc.ClientConfig{Retry: guardrail.Retry{AttemptTimeout: -time.Second}}},
		{"[/grpc.health.v1.Health/Check]", "[Check]", guardgrpc.ClientConfig{IdempotentMethods: []string{"Check"}}},
		{"bulkhead: {max_concurrent: 20}", "bulkhead: {max_concurrent: -1}", guardgrpc.ClientConfig{Bulkhead: &bulkhead.Config{MaxConcurrent: -1}}},
		{"bulkhead: {max_concurrent: 20}", "bulkhead: {max_concurrent: 2, max_wait: -1s}", guardgrpc.ClientConfig{Bulkhead: &bulkhead.Config{MaxConcurrent: 2, MaxWait: -time.Second}}},
		{"attempt_timeout: 2s", "hedge: {delay: -1ms}", guardgrpc.ClientConfig{Hedge: &guardrail.HedgeConfig{Delay: -time.Millisecond}}},
		{"attempt_timeout: 2s", "hedge: {percentile: 1}", guardgrpc.ClientConfig{Hedge: &guardrail.HedgeConfig{Percentile: 1}}},
		{"attempt_timeout: 2s", "hedge: {max_hedges: -1}", guardgrpc.ClientConfig{Hedge: &guardrail.HedgeConfig{MaxHedges: -1}}},
		{"attempt_timeout: 2s", "hedge: {window: 19}", guardgrpc.ClientConfig{Hedge: &guardrail.HedgeConfig{Window: 19}}},
		{"attempt_timeout: 2s", "hedge: {overload_pause: -1s}", guardgrpc.ClientConfig{Hedge: &guardrail.HedgeConfig{OverloadPause: -time.Second}}},
	} {
		if _, err := guardgrpc.NewClient(tc.cfg); err == nil {
			continue // guardgrpc accepts it: nothing to cover
		}
		file := strings.Replace(testFile, tc.old, tc.new, 1)
		if _, err := config.Parse("policy.yaml", []byte(file)); !errors.Is(err, config.ErrInvalidConfig) {
			t.Errorf("guardgrpc refuses %+v, but the file with %q checks", tc.cfg, tc.new)
		}
	}
	// And the valid ones build.
	for _, tc := range []struct{ old, new string }{
		{"max_buffered_messages: 8", "max_buffered_messages: -1"},
		{"failure_domain: method", "failure_domain: target"},
		{"idempotent_methods: [/grpc.health.v1.Health/Check]", "idempotent_methods: [/grpc.health.v1.Health/]"},
		{"bulkhead: {max_concurrent: 20}", "bulkhead: {disabled: true}"},
		{"attempt_timeout: 2s", "attempt_timeout: 2s\n    retry_budget: {unlimited: true}\n    min_attempt_time: -1s\n    max_retry_after: -1s"},
		{"attempt_timeout: 2s", "hedge: {}\n    throttle: {}"},
		{"attempt_timeout: 2s", "hedge: {delay: 1ms, percentile: 0.5, max_hedges: 16, window: 20, overload_pause: 1ns}\n    throttle: {window: 1ns, k: 1}"},
	} {
		reg := newRegistry(t, strings.Replace(testFile, tc.old, tc.new, 1))
		if _, err := grpcconfig.NewClient(reg, "health", grpcconfig.Options{}); err != nil {
			t.Errorf("with %q: %v", tc.new, err)
		}
	}
}

// The report of a gRPC dependency states guardgrpc's default buffer, which
// the config package cannot import.
func TestReportedDefaultBufferIsGuardgrpcs(t *testing.T) {
	c, err := config.Parse("policy.yaml", []byte(strings.Replace(testFile, "    max_buffered_messages: 8\n", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range c.Dependencies {
		for _, s := range d.Effective {
			if d.Name == "health" && s.Key == "max_buffered_messages" {
				if want := strconv.Itoa(guardgrpc.DefaultMaxBufferedMessages); s.Value != want {
					t.Errorf("reported max_buffered_messages %s; want guardgrpc's default %s", s.Value, want)
				}
				return
			}
		}
	}
	t.Error("the report of health has no max_buffered_messages")
}

// A dependency's deadline bounds a unary call, every attempt included, and
// reaches the server as grpc-timeout.
func TestDeadlineBoundsTheCall(t *testing.T) {
	file := strings.Replace(testFile, "    attempt_timeout: 2s\n", "    attempt_timeout: 2s\n    deadline: 300ms\n", 1)
	reg := newRegistry(t, file)
	c, err := grpcconfig.NewClient(reg, "health", grpcconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if _, dl := c.Config(); dl != 300*time.Millisecond {
		t.Errorf("deadline %v; want 300ms", dl)
	}
	h := &health{}
	announced := make(chan time.Duration, 1)
	h.script(func(ctx context.Context, _ int64) (*healthpb.HealthCheckResponse, error) {
		d, _ := ctx.Deadline()
		select {
		case announced <- time.Until(d):
		default:
		}
		<-ctx.Done() // hangs until the client gives up
		return nil, ctx.Err()
	})
	cl := dial(t, serve(t, h), c.DialOptions())
	start := time.Now()
	_, err = cl.Check(ctxTimeout(t, 20*time.Second), &healthpb.HealthCheckRequest{})
	if took := time.Since(start); status.Code(err) != codes.DeadlineExceeded || took > 5*time.Second {
		t.Fatalf("a hanging server: %v after %v; want DEADLINE_EXCEEDED at the 300ms deadline, not the caller's 20s", err, took)
	}
	if left := <-announced; left > 300*time.Millisecond || left <= 0 {
		t.Errorf("the server's deadline was %v away; want at most 300ms", left)
	}
}

// Streams run under the Client too, and are not cut by the deadline.
func TestStreamsFollowTheClient(t *testing.T) {
	file := strings.Replace(testFile, "    attempt_timeout: 2s\n", "    attempt_timeout: 2s\n    deadline: 1ms\n", 1)
	reg := newRegistry(t, file)
	c, err := grpcconfig.NewClient(reg, "health", grpcconfig.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &health{}
	cl := dial(t, serve(t, h), c.DialOptions())
	s, err := cl.Watch(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); err != nil {
		t.Fatalf("Recv: %v; want the server's message (a stream is not bounded by the 1ms deadline)", err)
	}
	if n := h.calls.Load(); n != 1 {
		t.Errorf("server saw %d streams; want 1", n)
	}
}

// Options reach the built ClientConfig.
func TestOptionsReachTheClient(t *testing.T) {
	reg := newRegistry(t, testFile)
	var classified atomic.Int64
	classify := func(r guardgrpc.Result) guardrail.Verdict {
		classified.Add(1)
		return guardgrpc.DefaultClassify(r)
	}
	c, err := grpcconfig.NewClient(reg, "health", grpcconfig.Options{Classify: classify})
	if err != nil {
		t.Fatal(err)
	}
	h := &health{}
	h.script(unavailable)
	cl := dial(t, serve(t, h), c.DialOptions())
	cl.Check(ctxTimeout(t, 10*time.Second), &healthpb.HealthCheckRequest{})
	if n := classified.Load(); n != 3 {
		t.Errorf("Classify ran %d times; want 3, once per failed attempt", n)
	}
}
