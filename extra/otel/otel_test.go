package otel_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	gotel "github.com/guardrail-go/guardrail/extra/otel"
)

type fixture struct {
	obs    *gotel.Observer
	spans  *tracetest.SpanRecorder
	reader *sdkmetric.ManualReader
	tp     *sdktrace.TracerProvider
}

func newFixture(t *testing.T, maxLabels int) *fixture {
	t.Helper()
	f := &fixture{spans: tracetest.NewSpanRecorder(), reader: sdkmetric.NewManualReader()}
	f.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(f.spans))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(f.reader))
	obs, err := gotel.New(gotel.Config{TracerProvider: f.tp, MeterProvider: mp, Propagator: propagation.TraceContext{}, MaxLabelValues: maxLabels})
	if err != nil {
		t.Fatal(err)
	}
	f.obs = obs
	t.Cleanup(func() { _ = obs.Close() })
	return f
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

func eventNames(s sdktrace.ReadOnlySpan) []string {
	var names []string
	for _, e := range s.Events() {
		names = append(names, e.Name)
	}
	return names
}

// split returns the call spans and the attempt spans, attempts in order.
func split(t *testing.T, spans []sdktrace.ReadOnlySpan) (calls, attempts []sdktrace.ReadOnlySpan) {
	t.Helper()
	for _, s := range spans {
		switch s.Name() {
		case "guardrail.call":
			calls = append(calls, s)
		case "guardrail.attempt":
			attempts = append(attempts, s)
		default:
			t.Fatalf("unexpected span %q", s.Name())
		}
	}
	sort.Slice(attempts, func(i, j int) bool {
		return attr(attempts[i], attribute.Key("guardrail.attempt")).AsInt64() < attr(attempts[j], attribute.Key("guardrail.attempt")).AsInt64()
	})
	return calls, attempts
}

// TestCallRetriedTwice: one parent span, three attempt children with their
// number, the backoff before them and their outcome; the gaps between the
// attempts are the backoff, visible as retry events on the call.
func TestCallRetriedTwice(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, 0)
		p := &guardrail.Policy{
			Name: "pricing", Idempotent: true, Observer: f.obs,
			Retry: guardrail.Retry{
				Backoff: backoff.Exponential(100*time.Millisecond, time.Second),
			},
		}
		n := 0
		ctx := event.WithOperation(context.Background(), "GetPrice")
		start := time.Now()
		v, err := guardrail.Do(ctx, p, func(context.Context) (int, error) {
			n++
			if n < 3 {
				return 0, guardrail.Transient(errors.New("503"))
			}
			return 42, nil
		})
		if v != 42 || err != nil {
			t.Fatalf("Do = %v, %v", v, err)
		}

		calls, attempts := split(t, f.spans.Ended())
		if len(calls) != 1 || len(attempts) != 3 {
			t.Fatalf("%d call spans, %d attempt spans; want 1 and 3", len(calls), len(attempts))
		}
		call := calls[0]
		if got := attr(call, attribute.Key("guardrail.outcome")).AsString(); got != event.OutcomeOK {
			t.Errorf("call outcome = %q", got)
		}
		if got := attr(call, attribute.Key("guardrail.attempts")).AsInt64(); got != 3 {
			t.Errorf("call attempts = %d", got)
		}
		if got := attr(call, attribute.Key("guardrail.dependency")).AsString(); got != "pricing" {
			t.Errorf("call dependency = %q", got)
		}
		if got := attr(call, attribute.Key("guardrail.operation")).AsString(); got != "GetPrice" {
			t.Errorf("call operation = %q", got)
		}
		if got, want := strings.Join(eventNames(call), ","), "guardrail.retry,guardrail.retry"; got != want {
			t.Errorf("call events = %s, want %s", got, want)
		}
		if call.Status().Code != codes.Unset {
			t.Errorf("call status = %v", call.Status())
		}
		if got, want := call.EndTime().Sub(call.StartTime()), 300*time.Millisecond; got != want {
			t.Errorf("call took %v, want %v (two backoffs)", got, want)
		}

		wantBackoff := []float64{0, 100, 200}
		wantOutcome := []string{"failure", "failure", "success"}
		wantStart := []time.Duration{0, 100 * time.Millisecond, 300 * time.Millisecond}
		for i, a := range attempts {
			if a.Parent().SpanID() != call.SpanContext().SpanID() || a.SpanContext().TraceID() != call.SpanContext().TraceID() {
				t.Errorf("attempt %d is not a child of the call span", i+1)
			}
			if got := attr(a, attribute.Key("guardrail.attempt")).AsInt64(); got != int64(i+1) {
				t.Errorf("attempt %d: number %d", i+1, got)
			}
			if got := attr(a, attribute.Key("guardrail.backoff_ms")).AsFloat64(); got != wantBackoff[i] {
				t.Errorf("attempt %d: backoff %v ms, want %v", i+1, got, wantBackoff[i])
			}
			if got := attr(a, attribute.Key("guardrail.outcome")).AsString(); got != wantOutcome[i] {
				t.Errorf("attempt %d: outcome %q, want %q", i+1, got, wantOutcome[i])
			}
			if got := a.StartTime().Sub(start); got != wantStart[i] {
				t.Errorf("attempt %d started at +%v, want +%v", i+1, got, wantStart[i])
			}
			if a.EndTime().Before(a.StartTime()) || a.EndTime().Sub(a.StartTime()) != 0 {
				t.Errorf("attempt %d lasted %v, want 0 (the op returns at once)", i+1, a.EndTime().Sub(a.StartTime()))
			}
			if wantOutcome[i] == "failure" && a.Status().Code != codes.Error {
				t.Errorf("attempt %d status = %v, want Error", i+1, a.Status())
			}
		}
	})
}

// TestAttemptTimeoutPhase: Do reports its attempt timeout after the
// attempt's end; the phase still lands on that attempt's span, which ends
// at the attempt's end, not later.
func TestAttemptTimeoutPhase(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, 0)
		p := &guardrail.Policy{
			Name: "search", Idempotent: true, Retry: guardrail.Retry{
				AttemptTimeout: 50 * time.Millisecond,
				Backoff:        backoff.Constant(10 * time.Millisecond),
			},
			Observer: f.obs,
		}
		n := 0
		_, err := guardrail.Do(context.Background(), p, func(ctx context.Context) (int, error) {
			n++
			if n == 1 {
				<-ctx.Done()
				return 0, ctx.Err()
			}
			return 1, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		calls, attempts := split(t, f.spans.Ended())
		if len(calls) != 1 || len(attempts) != 2 {
			t.Fatalf("%d calls, %d attempts", len(calls), len(attempts))
		}
		if got := attr(attempts[0], attribute.Key("guardrail.timeout_phase")).AsString(); got != event.PhaseAttempt {
			t.Errorf("attempt 1 timeout phase = %q, want %q", got, event.PhaseAttempt)
		}
		if got := attempts[0].EndTime().Sub(attempts[0].StartTime()); got != 50*time.Millisecond {
			t.Errorf("attempt 1 lasted %v, want 50ms", got)
		}
		if got := attr(attempts[1], attribute.Key("guardrail.timeout_phase")); got.Type() != attribute.EMPTY {
			t.Errorf("attempt 2 has a timeout phase %v", got.String())
		}
		if got := attr(attempts[1], attribute.Key("guardrail.backoff_ms")).AsFloat64(); got != 10 {
			t.Errorf("attempt 2 backoff = %v ms, want 10", got)
		}
	})
}

// TestRefusedRetryAndBreakerEvents: a budget refusal and a breaker
// transition reported during a call are events of the call span.
func TestRefusedRetryAndBreakerEvents(t *testing.T) {
	f := newFixture(t, 0)
	breakerTransition := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.BudgetExhausted {
			// A transition reported with a call's context (the attempt's
			// end carries the attempt's own context, so use a call event).
			f.obs.Observe(ctx, event.Event{Kind: event.BreakerTransition, Dependency: e.Dependency, From: "closed", To: "open", Reason: "failure rate 1 of 1 calls >= 0.5"})
		}
		return ctx
	})
	b := must(budget.New(budget.Config{Max: 1}))
	b.TryRetry() // empty it
	p := &guardrail.Policy{Name: "ledger", Idempotent: true, Retry: guardrail.Retry{Budget: b}, Observer: event.Join(f.obs, breakerTransition)}
	_, err := guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
		return 0, guardrail.Transient(errors.New("503"))
	})
	if !errors.Is(err, guardrail.ErrBudgetExhausted) {
		t.Fatalf("err = %v", err)
	}
	calls, attempts := split(t, f.spans.Ended())
	if len(calls) != 1 || len(attempts) != 1 {
		t.Fatalf("%d calls, %d attempts", len(calls), len(attempts))
	}
	if got, want := strings.Join(eventNames(calls[0]), ","), "guardrail.budget_exhausted,"+"guardrail.breaker.transition"+",guardrail.retry_refused,exception"; got != want {
		t.Errorf("call events = %s, want %s", got, want)
	}
	if calls[0].Status().Code != codes.Error || calls[0].Status().Description != event.OutcomeBudgetExhausted {
		t.Errorf("call status = %+v", calls[0].Status())
	}
	for _, e := range calls[0].Events() {
		if e.Name == "guardrail.breaker.transition" {
			got := map[attribute.Key]string{}
			for _, a := range e.Attributes {
				got[a.Key] = a.Value.String()
			}
			if got[attribute.Key("guardrail.breaker.from")] != "closed" || got[attribute.Key("guardrail.breaker.to")] != "open" || got[attribute.Key("guardrail.reason")] == "" {
				t.Errorf("transition event attributes = %v", got)
			}
		}
	}
}

// TestTransportPropagatesAttemptSpan: the request an attempt sends carries
// the attempt span's trace context; the caller's request is not modified.
func TestTransportPropagatesAttemptSpan(t *testing.T) {
	f := newFixture(t, 0)
	var seen []string
	next := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		seen = append(seen, r.Header.Get("traceparent"))
		return &http.Response{StatusCode: 200, Body: http.NoBody, Request: r}, nil
	})
	client := &http.Client{Transport: gotel.Transport(next, propagation.TraceContext{})}
	p := &guardrail.Policy{Name: "api", Idempotent: true, Retry: guardrail.Retry{Backoff: backoff.None()}, Observer: f.obs}
	var sent []*http.Request
	_, err := guardrail.Do(context.Background(), p, func(ctx context.Context) (int, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://api.internal/x", nil)
		sent = append(sent, req)
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		if len(sent) == 1 {
			return 0, guardrail.Transient(errors.New("503"))
		}
		return 1, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	_, attempts := split(t, f.spans.Ended())
	if len(seen) != 2 || len(attempts) != 2 {
		t.Fatalf("%d requests, %d attempt spans", len(seen), len(attempts))
	}
	for i, a := range attempts {
		sc := a.SpanContext()
		want := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID())
		if seen[i] != want {
			t.Errorf("request %d traceparent = %q, want %q (attempt %d's span)", i+1, seen[i], want, i+1)
		}
		if sent[i].Header.Get("traceparent") != "" {
			t.Errorf("the caller's request %d was modified", i+1)
		}
	}
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestMiddlewareJoinsCallerTrace: a guarded call made by a handler belongs
// to the caller's trace.
func TestMiddlewareJoinsCallerTrace(t *testing.T) {
	f := newFixture(t, 0)
	p := &guardrail.Policy{Name: "db", Observer: f.obs}
	h := f.obs.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = guardrail.Do(r.Context(), p, func(context.Context) (int, error) { return 1, nil })
	}))
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	h.ServeHTTP(httptest.NewRecorder(), req)
	calls, _ := split(t, f.spans.Ended())
	if len(calls) != 1 {
		t.Fatalf("%d call spans", len(calls))
	}
	if got := calls[0].SpanContext().TraceID().String(); got != traceID {
		t.Errorf("trace ID = %s, want the caller's %s", got, traceID)
	}
	if got := calls[0].Parent().SpanID().String(); got != parentID || !calls[0].Parent().IsRemote() {
		t.Errorf("parent = %s (remote %v), want the caller's %s", got, calls[0].Parent().IsRemote(), parentID)
	}
}

// TestMetrics: the metrics API gets the same series as extra/prom, with
// the same counts.
func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, 0)
		p := &guardrail.Policy{Name: "pricing", Idempotent: true, Retry: guardrail.Retry{Backoff: backoff.None(), Budget: budget.Unlimited()}, Observer: f.obs}
		f.obs.WatchPolicy(p)
		f.obs.WatchBreaker("pricing", p.BreakerInUse()) // watched through the policy already: counted once
		ctx, cancel := context.WithTimeout(event.WithOperation(context.Background(), "Get"), time.Second)
		defer cancel()
		for i := range 4 {
			n := 0
			_, _ = guardrail.Do(ctx, p, func(context.Context) (int, error) {
				n++
				if n <= i {
					return 0, guardrail.Transient(errors.New("503"))
				}
				return 1, nil
			})
		}
		got := collect(t, f.reader)
		l := `dependency=pricing,operation=Get`
		want := map[string]float64{
			"guardrail.calls{" + l + ",outcome=ok}":                       3,
			"guardrail.calls{" + l + ",outcome=error}":                    1,
			"guardrail.attempts{" + l + ",outcome=success}":               3,
			"guardrail.attempts{" + l + ",outcome=failure}":               6,
			"guardrail.retries{" + l + ",reason=backoff}":                 5,
			"guardrail.retries.refused{" + l + ",reason=attempts}":        1,
			"guardrail.retry.success{" + l + "}":                          2,
			"guardrail.retry.exhausted{" + l + ",outcome=error}":          1,
			"guardrail.deadline.remaining.count{" + l + "}":               9,
			"guardrail.call.duration.count{" + l + "}":                    4,
			"guardrail.attempt.duration.count{" + l + ",outcome=success}": 3,
			"guardrail.attempt.duration.count{" + l + ",outcome=failure}": 6,
			"guardrail.breaker.state{dependency=pricing,state=closed}":    1,
			"guardrail.breaker.state{dependency=pricing,state=open}":      0,
			"guardrail.breaker.state{dependency=pricing,state=half_open}": 0,
			"guardrail.retry_budget.tokens{dependency=pricing}":           inf,
		}
		for k, w := range want {
			if g, ok := got[k]; !ok || g != w {
				t.Errorf("%s = %v (present %v), want %v", k, g, ok, w)
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("unexpected %s = %v", k, got[k])
			}
		}
	})
}

var inf = func() float64 { return budget.Unlimited().Tokens() }()

// TestMetricCardinality: 10,000 distinct operations give a bounded number
// of attribute sets.
func TestMetricCardinality(t *testing.T) {
	f := newFixture(t, 10)
	p := &guardrail.Policy{Name: "users", Observer: f.obs}
	for i := range 10_000 {
		ctx := event.WithOperation(context.Background(), fmt.Sprintf("/users/%d", i))
		_, _ = guardrail.Do(ctx, p, func(context.Context) (int, error) { return 1, nil })
	}
	got := collect(t, f.reader)
	var sets int
	var total float64
	for k, v := range got {
		if strings.HasPrefix(k, "guardrail.calls{") {
			sets++
			total += v
		}
	}
	if sets != 11 || total != 10_000 {
		t.Errorf("guardrail.calls: %d attribute sets counting %v calls, want 11 (10 + other) counting 10000", sets, total)
	}
	if got["guardrail.calls{dependency=users,operation=other,outcome=ok}"] != 9_990 {
		t.Errorf("other = %v, want 9990", got["guardrail.calls{dependency=users,operation=other,outcome=ok}"])
	}
}

// collect returns every data point as name{k=v,...} -> value; histograms
// give name.count.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]float64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := make(map[string]float64)
	id := func(s attribute.Set) string {
		var kv []string
		for _, a := range s.ToSlice() {
			kv = append(kv, string(a.Key)+"="+a.Value.String())
		}
		return "{" + strings.Join(kv, ",") + "}"
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					out[m.Name+id(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[int64]:
				for _, p := range d.DataPoints {
					out[m.Name+id(p.Attributes)] = float64(p.Value)
				}
			case metricdata.Gauge[float64]:
				for _, p := range d.DataPoints {
					out[m.Name+id(p.Attributes)] = p.Value
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					out[m.Name+".count"+id(p.Attributes)] = float64(p.Count)
				}
			default:
				t.Fatalf("%s: unexpected data %T", m.Name, m.Data)
			}
		}
	}
	return out
}

// TestPolicyBreakerTransitionSpan: a policy's breaker reports its
// transitions outside any call's context; each becomes a span of its own
// with its cause, and the rejected calls say why on their spans.
func TestPolicyBreakerTransitionSpan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newFixture(t, 0)
		p := &guardrail.Policy{
			Name: "ledger", Retry: guardrail.Retry{
				MaxAttempts: 1,
			},
			Observer: f.obs,
			Breaker:  must(breaker.New(breaker.Config{Name: "ledger", MinRequests: 2, OpenFor: 5 * time.Second, OpenJitter: -1, Observer: f.obs})),
		}
		for range 3 {
			_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
				return 0, guardrail.Transient(errors.New("503"))
			})
		}
		var transitions, calls []sdktrace.ReadOnlySpan
		for _, s := range f.spans.Ended() {
			switch s.Name() {
			case "guardrail.breaker.transition":
				transitions = append(transitions, s)
			case "guardrail.call":
				calls = append(calls, s)
			}
		}
		if len(transitions) != 1 || len(calls) != 3 {
			t.Fatalf("%d transition spans, %d call spans; want 1 and 3", len(transitions), len(calls))
		}
		tr := transitions[0]
		for k, want := range map[attribute.Key]string{
			attribute.Key("guardrail.dependency"): "ledger", attribute.Key("guardrail.breaker.from"): "closed", attribute.Key("guardrail.breaker.to"): "open",
			attribute.Key("guardrail.reason"): "failure_rate", attribute.Key("guardrail.breaker.cause"): "failure rate 1 of 2 calls >= 0.5", attribute.Key("guardrail.breaker.open_for_ms"): "5000",
		} {
			if got := attr(tr, k).String(); got != want {
				t.Errorf("transition %s = %q, want %q", k, got, want)
			}
		}
		if tr.Parent().IsValid() {
			t.Errorf("the transition span has a parent, %v", tr.Parent())
		}
		rejected := calls[2]
		if got := attr(rejected, attribute.Key("guardrail.outcome")).AsString(); got != event.OutcomeCircuitOpen {
			t.Errorf("third call outcome = %q", got)
		}
		if got := strings.Join(eventNames(rejected), ","); got != "guardrail.breaker.reject,exception" {
			t.Errorf("third call events = %s", got)
		}
	})
}

// TestInvalidConfig: New refuses an invalid field with an error naming it
// that Is ErrInvalidConfig.
func TestInvalidConfig(t *testing.T) {
	for _, tc := range []struct {
		cfg  gotel.Config
		want string
	}{
		{gotel.Config{MaxLabelValues: -5}, "otel: Config.MaxLabelValues is -5; want 0 (the default, 100) or more"},
		{gotel.Config{DurationBuckets: []float64{0.1, math.NaN()}}, "otel: Config.DurationBuckets is [0.1 NaN]; want finite boundaries in strictly increasing order, or none for the default"},
		{gotel.Config{RemainingBuckets: []float64{1, math.Inf(1)}}, "otel: Config.RemainingBuckets is [1 +Inf]; want finite boundaries in strictly increasing order, or none for the default"},
		// Every invalid field is named, not only the first.
		{gotel.Config{MaxLabelValues: -5, DurationBuckets: []float64{2, 1}},
			"otel: Config.MaxLabelValues is -5; want 0 (the default, 100) or more\n" +
				"otel: Config.DurationBuckets is [2 1]; want finite boundaries in strictly increasing order, or none for the default"},
	} {
		o, err := gotel.New(tc.cfg)
		if o != nil || !errors.Is(err, gotel.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, %v; want nil and ErrInvalidConfig", tc.cfg, o, err)
			continue
		}
		if err.Error() != tc.want {
			t.Errorf("New(%+v): %q, want %q", tc.cfg, err, tc.want)
		}
	}
}

// TestBreakerGroupUnderName: a group that splits a named dependency
// reports each breaker under the name with its key; a transition event
// under that name adds no second data point for the same breaker.
func TestBreakerGroupUnderName(t *testing.T) {
	f := newFixture(t, 0)
	g := must(breaker.NewGroup(breaker.GroupConfig{}))
	f.obs.WatchBreakerGroup("users", g)
	g.Get("u1:443").ForceOpen()
	f.obs.Observe(context.Background(), event.Event{Kind: event.BreakerTransition, Dependency: "users", From: "closed", To: "open", Reason: "forced_open"})
	got := collect(t, f.reader)
	want := map[string]float64{
		"guardrail.breaker.state{dependency=users,key=u1:443,state=closed}":                      0,
		"guardrail.breaker.state{dependency=users,key=u1:443,state=open}":                        1,
		"guardrail.breaker.state{dependency=users,key=u1:443,state=half_open}":                   0,
		"guardrail.breaker.transitions{dependency=users,from=closed,reason=forced_open,to=open}": 1,
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %s = %v", k, got[k])
		}
	}
}

// must returns v, for constructors given a configuration the test knows is
// valid.
func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestConfigReloads: policy file reloads are counted by outcome alone.
func TestConfigReloads(t *testing.T) {
	f := newFixture(t, 0)
	ctx := context.Background()
	f.obs.Observe(ctx, event.Event{Kind: event.ConfigReload, Outcome: event.OutcomeOK, Detail: "/etc/policy.yaml"})
	for range 2 {
		f.obs.Observe(ctx, event.Event{Kind: event.ConfigReload, Outcome: event.OutcomeError, Detail: "/etc/policy.yaml", Err: errors.New("invalid")})
	}
	got := collect(t, f.reader)
	want := map[string]float64{
		"guardrail.config.reloads{outcome=ok}":    1,
		"guardrail.config.reloads{outcome=error}": 2,
	}
	for k, w := range want {
		if g, ok := got[k]; !ok || g != w {
			t.Errorf("%s = %v (present %v), want %v", k, g, ok, w)
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected %s = %v", k, got[k])
		}
	}
}
