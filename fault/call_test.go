package fault_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/fault"
)

func newInjector(t *testing.T, cfg fault.Config) *fault.Injector {
	t.Helper()
	in, err := fault.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	return in
}

// countingOp is an operation that counts its runs and answers 42.
type countingOp struct{ runs atomic.Int32 }

func (o *countingOp) op(ctx context.Context) (int, error) {
	o.runs.Add(1)
	return 42, nil
}

// Every fault on a wrapped function: what the caller gets, and whether the
// function ran.
func TestWrapFaults(t *testing.T) {
	var statusErr *fault.StatusError
	tests := []struct {
		name  string
		fault fault.Fault
		runs  int32
		check func(v int, err error) bool
	}{
		{"status", fault.Status{Code: 429}, 0, func(_ int, err error) bool {
			return errors.As(err, &statusErr) && statusErr.Code == 429 &&
				guardrail.DefaultClassify(err).RetryAfter == 0
		}},
		{"status grpc code and retry after", fault.Status{GRPCCode: "RESOURCE_EXHAUSTED", RetryAfter: 1500 * time.Millisecond}, 0,
			func(_ int, err error) bool {
				return errors.As(err, &statusErr) && statusErr.Code == 503 && statusErr.GRPCCode == "RESOURCE_EXHAUSTED" &&
					guardrail.DefaultClassify(err).RetryAfter == 1500*time.Millisecond
			}},
		{"reset", fault.Reset{}, 0, func(_ int, err error) bool {
			v := guardrail.DefaultClassify(err)
			return errors.Is(err, syscall.ECONNRESET) && v.Unanswered && !v.Unsent
		}},
		{"refuse", fault.Refuse{}, 0, func(_ int, err error) bool {
			return errors.Is(err, syscall.ECONNREFUSED) && guardrail.DefaultClassify(err).Unsent
		}},
		{"lose response", fault.LoseResponse{}, 1, func(v int, err error) bool {
			return v == 0 && errors.Is(err, syscall.ECONNRESET) && guardrail.DefaultClassify(err).Unanswered
		}},
		{"slow body passes", fault.SlowBody{}, 1, func(v int, err error) bool { return v == 42 && err == nil }},
		{"stall body passes", fault.StallBody{}, 1, func(v int, err error) bool { return v == 42 && err == nil }},
		{"truncate passes", fault.Truncate{}, 1, func(v int, err error) bool { return v == 42 && err == nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := newInjector(t, fault.Config{Rules: []fault.Rule{{Match: fault.Match{Path: "/db/**"}, Fault: tt.fault}}})
			var o countingOp
			v, err := fault.Wrap(in, "/db/orders.insert", o.op)(t.Context())
			if !tt.check(v, err) || o.runs.Load() != tt.runs {
				t.Errorf("got %d, %v with %d runs; want %d runs", v, err, o.runs.Load(), tt.runs)
			}
			// A call the rule does not match passes through.
			v, err = fault.Wrap(in, "/queue/orders", o.op)(t.Context())
			if v != 42 || err != nil {
				t.Errorf("unmatched call: %d, %v; want 42, nil", v, err)
			}
			if c := in.Counters()[0]; c.Matched != 1 || c.Fired != 1 {
				t.Errorf("counters %+v; want matched 1, fired 1", c)
			}
		})
	}
}

// A function call has no method and no headers: rules that ask for them
// never match it.
func TestWrapMethodsAndHeadersNeverMatch(t *testing.T) {
	in := newInjector(t, fault.Config{Rules: []fault.Rule{
		{Match: fault.Match{Methods: []string{"POST"}}, Fault: fault.Reset{}},
		{Match: fault.Match{Headers: map[string]string{"X-Any": "*"}}, Fault: fault.Reset{}},
	}})
	var o countingOp
	if v, err := fault.Wrap(in, "/db/x", o.op)(t.Context()); v != 42 || err != nil {
		t.Errorf("got %d, %v; want 42, nil", v, err)
	}
}

// Latency waits before the function runs, as long as the rule says; a
// context that ends first fails the call without running it. A hang holds
// the call until its context ends.
func TestWrapLatencyAndHang(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		in := newInjector(t, fault.Config{Rules: []fault.Rule{
			{Match: fault.Match{Path: "/slow"}, Fault: fault.Latency{Delay: 2 * time.Second}},
			{Match: fault.Match{Path: "/hang"}, Fault: fault.Hang{}},
		}})
		var o countingOp
		start := time.Now()
		if v, err := fault.Wrap(in, "/slow", o.op)(t.Context()); v != 42 || err != nil || time.Since(start) != 2*time.Second {
			t.Errorf("delay: %d, %v after %v; want 42 after 2s", v, err, time.Since(start))
		}

		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		start = time.Now()
		if _, err := fault.Wrap(in, "/slow", o.op)(ctx); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != time.Second {
			t.Errorf("delay past the deadline: %v after %v; want DeadlineExceeded after 1s", err, time.Since(start))
		}

		ctx, cancel = context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		start = time.Now()
		if _, err := fault.Wrap(in, "/hang", o.op)(ctx); !errors.Is(err, context.DeadlineExceeded) || time.Since(start) != 5*time.Second {
			t.Errorf("hang: %v after %v; want DeadlineExceeded after 5s", err, time.Since(start))
		}
		if o.runs.Load() != 1 {
			t.Errorf("%d runs; want 1 (only the delay that completed)", o.runs.Load())
		}

		// Close releases a hang with ErrClosed.
		done := make(chan error)
		go func() {
			_, err := fault.Wrap(in, "/hang", o.op)(t.Context())
			done <- err
		}()
		synctest.Wait()
		in.Close()
		if err := <-done; !errors.Is(err, fault.ErrClosed) {
			t.Errorf("hang after Close: %v; want ErrClosed", err)
		}
	})
}

// The case idempotency exists for: guardrail.Do over an operation that is
// not idempotent, whose answer is lost after it ran, ends in
// ErrOutcomeUnknown with the operation run once, not retried.
func TestDoOverLostResponse(t *testing.T) {
	in := newInjector(t, fault.Config{Rules: []fault.Rule{{Match: fault.Match{Path: "/db/orders.insert"}, Fault: fault.LoseResponse{}}}})
	var o countingOp
	p := &guardrail.Policy{Retry: guardrail.Retry{Budget: budget.Unlimited(), Backoff: backoff.None()}}
	_, err := guardrail.Do(t.Context(), p, fault.Wrap(in, "/db/orders.insert", o.op))
	if !errors.Is(err, guardrail.ErrOutcomeUnknown) || o.runs.Load() != 1 {
		t.Errorf("%v with %d runs; want ErrOutcomeUnknown with 1 run", err, o.runs.Load())
	}
}

// guardrail.Do waits the injected RetryAfter before the next attempt, not
// its backoff.
func TestDoHonoursInjectedRetryAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		draws := []float64{0.1, 0.9} // the rule fires on the first call only
		var n atomic.Int32
		in := newInjector(t, fault.Config{
			Rules: []fault.Rule{{Probability: 0.5, Fault: fault.Status{Code: 503, RetryAfter: 3 * time.Second}}},
			Rand:  func() float64 { return draws[min(int(n.Add(1))-1, len(draws)-1)] },
		})
		var o countingOp
		p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{Budget: budget.Unlimited(), Backoff: backoff.None()}}
		start := time.Now()
		v, err := guardrail.Do(t.Context(), p, fault.Wrap(in, "/pricing/quote", o.op))
		if v != 42 || err != nil || o.runs.Load() != 1 || time.Since(start) != 3*time.Second {
			t.Errorf("%d, %v with %d runs after %v; want 42 with 1 run after 3s", v, err, o.runs.Load(), time.Since(start))
		}
	})
}

// An injected status is classified as the same HTTP answer would be: a
// 503 is retried, a 404 is the request's own fault (not retried, ignored
// by the breaker), a 429 without a Retry-After is not retried.
func TestDoClassifiesInjectedStatusAsHTTP(t *testing.T) {
	for _, tc := range []struct {
		code, attempts int
		outcome        string
	}{
		{503, 3, "failure"},
		{404, 1, "ignored"},
		{429, 1, "failure"},
	} {
		t.Run(strconv.Itoa(tc.code), func(t *testing.T) {
			in := newInjector(t, fault.Config{Rules: []fault.Rule{{Fault: fault.Status{Code: tc.code}}}})
			var o countingOp
			var attempts int
			var outcomes []string
			obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
				if e.Kind == event.AttemptEnd {
					attempts++
					outcomes = append(outcomes, e.Outcome)
				}
				return ctx
			})
			p := &guardrail.Policy{Idempotent: true, Observer: obs, Retry: guardrail.Retry{Budget: budget.Unlimited(), Backoff: backoff.None()}}
			_, err := guardrail.Do(t.Context(), p, fault.Wrap(in, "/pricing/quote", o.op))
			var se *fault.StatusError
			if !errors.As(err, &se) || se.Code != tc.code {
				t.Fatalf("err %v, want the injected %d", err, tc.code)
			}
			if attempts != tc.attempts || outcomes[0] != tc.outcome || o.runs.Load() != 0 {
				t.Errorf("%d attempts %v, op ran %d times; want %d attempts, outcome %s, op never run", attempts, outcomes, o.runs.Load(), tc.attempts, tc.outcome)
			}
		})
	}
}

// Apply matches headers on metadata (lower-case keys) and reads header
// faults from it when they are enabled.
func TestApplyMetadata(t *testing.T) {
	in := newInjector(t, fault.Config{HeaderFaults: true, Rules: []fault.Rule{
		{Match: fault.Match{Headers: map[string]string{"X-Tenant": "canary-*"}}, Fault: fault.Reset{}},
	}})
	for _, tt := range []struct {
		md   map[string][]string
		want fault.Fault
	}{
		{map[string][]string{"x-tenant": {"prod", "canary-7"}}, fault.Reset{}},
		{map[string][]string{"x-tenant": {"prod"}}, nil},
		{nil, nil},
		{map[string][]string{"x-fault": {"refuse"}}, fault.Refuse{}},
	} {
		f, err := in.Apply(t.Context(), fault.Call{Method: "POST", Path: "/a.B/C", Metadata: lookup(tt.md)})
		if err != nil || f != tt.want {
			t.Errorf("%v: %#v, %v; want %#v", tt.md, f, err, tt.want)
		}
	}
	// An empty Host is the :authority of the metadata.
	hosts := newInjector(t, fault.Config{Rules: []fault.Rule{{Match: fault.Match{Host: "pricing.*"}, Fault: fault.Reset{}}}})
	for authority, want := range map[string]fault.Fault{"pricing.internal:50051": fault.Reset{}, "billing.internal:50051": nil} {
		md := lookup(map[string][]string{":authority": {authority}})
		if f, err := hosts.Apply(t.Context(), fault.Call{Metadata: md}); f != want || err != nil {
			t.Errorf(":authority %s: %#v, %v; want %#v", authority, f, err, want)
		}
	}
	_, err := in.Apply(t.Context(), fault.Call{Metadata: lookup(map[string][]string{"x-fault": {"nonsense"}})})
	if !errors.Is(err, fault.ErrInvalidConfig) {
		t.Errorf("bad header fault: %v; want ErrInvalidConfig", err)
	}
}

// lookup is the Metadata of a call with metadata md, nil for none.
func lookup(md map[string][]string) func(string) []string {
	if md == nil {
		return nil
	}
	return func(k string) []string { return md[k] }
}

// Apply allocates nothing for a call that gets no fault, headers and all.
func TestApplyAllocs(t *testing.T) {
	in := newInjector(t, fault.Config{HeaderFaults: true, Rules: []fault.Rule{
		{Match: fault.Match{Path: "/a.B/**", Headers: map[string]string{"X-Tenant": "canary-*"}}, Fault: fault.Reset{}},
	}})
	md := map[string][]string{"x-tenant": {"prod"}}
	ctx := t.Context()
	allocs := testing.AllocsPerRun(100, func() {
		get := func(k string) []string { return md[k] }
		if f, err := in.Apply(ctx, fault.Call{Method: "POST", Host: "h:1", Path: "/a.B/C", Metadata: get}); f != nil || err != nil {
			t.Fatal(f, err)
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per call; want 0", allocs)
	}
}

// grpc_code is read from rule files and one-line rules, in any case, and
// refused when it names no gRPC error code.
func TestParseGRPCCode(t *testing.T) {
	cfg, err := fault.ParseConfig([]byte(`{"rules":[{"kind":"error","grpc_code":"resource_exhausted","retry_after":"2s"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if st := cfg.Rules[0].Fault.(fault.Status); st.GRPCCode != "RESOURCE_EXHAUSTED" || st.RetryAfter != 2*time.Second {
		t.Errorf("parsed %+v", st)
	}
	r, err := fault.ParseRule("error; grpc_code=UNAVAILABLE")
	if err != nil || r.Fault.(fault.Status).GRPCCode != "UNAVAILABLE" {
		t.Errorf("one-line rule: %+v, %v", r, err)
	}
	for _, bad := range []string{
		`{"rules":[{"kind":"error","grpc_code":"OK"}]}`,
		`{"rules":[{"kind":"error","grpc_code":"EXHAUSTED"}]}`,
		`{"rules":[{"kind":"error","grpc_code":""}]}`,
		`{"rules":[{"kind":"reset","grpc_code":"UNAVAILABLE"}]}`,
	} {
		_, err := fault.ParseConfig([]byte(bad))
		var re *fault.RuleError
		if !errors.As(err, &re) || re.Field != "grpc_code" || !errors.Is(err, fault.ErrInvalidConfig) {
			t.Errorf("%s: %v; want a RuleError on grpc_code", bad, err)
		}
	}
	if _, err := fault.New(fault.Config{Rules: []fault.Rule{{Fault: fault.Status{GRPCCode: "unavailable"}}}}); err == nil ||
		!strings.Contains(err.Error(), "grpc_code") {
		t.Errorf("lower-case GRPCCode in Go: %v; want an error naming grpc_code", err)
	}
}
