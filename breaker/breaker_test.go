package breaker_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/event"
)

var errBoom = errors.New("boom")

// calls makes n calls with outcome o and returns how many were admitted.
func calls(b *breaker.Breaker, o breaker.Outcome, n int) (admitted int) {
	for range n {
		p, err := b.Allow()
		if err != nil {
			continue
		}
		admitted++
		p.Done(o, 0)
	}
	return admitted
}

// recorder collects the transitions a breaker reports to its Observer.
type recorder struct {
	mu sync.Mutex
	es []event.Event
}

func (r *recorder) Observe(ctx context.Context, e event.Event) context.Context {
	r.mu.Lock()
	r.es = append(r.es, e)
	r.mu.Unlock()
	return ctx
}

func (r *recorder) list() []event.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]event.Event(nil), r.es...)
}

func (r *recorder) path() string {
	var s []string
	for _, e := range r.list() {
		s = append(s, e.From+">"+e.To+"("+e.Reason+")")
	}
	return strings.Join(s, " ")
}

func wantState(t *testing.T, b *breaker.Breaker, want breaker.State) {
	t.Helper()
	if got := b.State(); got != want {
		t.Fatalf("state = %v, want %v", got, want)
	}
}

// trip opens a breaker configured with MinRequests <= n by n failures.
func trip(t *testing.T, b *breaker.Breaker, n int) {
	t.Helper()
	calls(b, breaker.Failure, n)
	wantState(t, b, breaker.Open)
}

func TestStateAndModeStrings(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{breaker.Closed.String(), "closed"},
		{breaker.Open.String(), "open"},
		{breaker.HalfOpen.String(), "half_open"},
		{breaker.State(9).String(), "unknown"},
		{breaker.Normal.String(), "normal"},
		{breaker.MetricsOnly.String(), "metrics_only"},
		{breaker.Disabled.String(), "disabled"},
		{breaker.Success.String(), "success"},
		{breaker.Failure.String(), "failure"},
		{breaker.Ignored.String(), "ignored"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// With a minimum volume of one call, 1 success + 2 failures at low traffic
// open the breaker; with MinRequests 20 the same traffic does not.
func TestMinimumVolume(t *testing.T) {
	for _, tc := range []struct {
		name        string
		minRequests int
		want        breaker.State
	}{
		{"no minimum", 1, breaker.Open},
		{"MinRequests 20", 20, breaker.Closed},
		{"default (20)", 0, breaker.Closed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := mustNew(breaker.Config{MinRequests: tc.minRequests})
				for _, err := range []error{nil, errBoom, errBoom} {
					b.Execute(func() error { return err })
					time.Sleep(time.Second) // low traffic: 1 call a second
				}
				wantState(t, b, tc.want)
			})
		})
	}
}

// 30 errors classified as 4xx-like never count.
func TestIgnoredErrorsNeverCount(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		errNotFound := errors.New("404 not found")
		b := mustNew(breaker.Config{
			MinRequests: 1,
			Classify: func(err error) breaker.Outcome {
				if errors.Is(err, errNotFound) {
					return breaker.Ignored
				}
				return breaker.DefaultClassify(err)
			},
		})
		for range 30 {
			if err := b.Execute(func() error { return errNotFound }); err != errNotFound {
				t.Fatalf("Execute = %v, want the call's error", err)
			}
		}
		wantState(t, b, breaker.Closed)
		if m := b.Metrics(); m.Calls != 0 || m.Failures != 0 {
			t.Fatalf("counted calls=%d failures=%d, want 0 and 0", m.Calls, m.Failures)
		}
	})
}

// An outage with 30 calls and a fallback. Every call is answered
// by the fallback; only the calls needed to trip reach the dependency.
func TestOutageWithFallback(t *testing.T) {
	for _, tc := range []struct {
		minRequests, wantReached int
	}{
		{4, 4},
		{0, 20}, // the default minimum volume
	} {
		synctest.Test(t, func(t *testing.T) {
			b := mustNew(breaker.Config{MinRequests: tc.minRequests})
			reached, fallback := 0, 0
			for range 30 {
				err := b.Execute(func() error { reached++; return errBoom })
				if err != nil {
					fallback++ // a stale cached price, say
				}
				time.Sleep(10 * time.Millisecond)
			}
			if fallback != 30 || reached != tc.wantReached {
				t.Fatalf("MinRequests %d: fallback answered %d, dependency saw %d; want 30 and %d",
					tc.minRequests, fallback, reached, tc.wantReached)
			}
		})
	}
}

// After OpenFor one probe goes through; success closes, failure
// re-opens.
func TestProbeAfterOpenFor(t *testing.T) {
	for _, tc := range []struct {
		probe breaker.Outcome
		want  breaker.State
	}{
		{breaker.Success, breaker.Closed},
		{breaker.Failure, breaker.Open},
	} {
		t.Run(tc.probe.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const openFor = 30 * time.Second
				b := mustNew(breaker.Config{MinRequests: 5, OpenFor: openFor, OpenJitter: -1})
				trip(t, b, 5)
				start := time.Now()

				time.Sleep(openFor - time.Millisecond)
				_, err := b.Allow()
				var oe *breaker.OpenError
				if !errors.As(err, &oe) || !errors.Is(err, breaker.ErrOpen) {
					t.Fatalf("Allow before OpenFor = %v, want *OpenError", err)
				}
				if got, want := oe.RetryIn(), time.Millisecond; got != want {
					t.Fatalf("RetryIn = %v, want %v", got, want)
				}
				if got, want := oe.Until, start.Add(openFor); !got.Equal(want) {
					t.Fatalf("Until = %v, want %v", got, want)
				}

				time.Sleep(time.Millisecond)
				p, err := b.Allow()
				if err != nil || !p.Probe() {
					t.Fatalf("Allow at OpenFor = %v (probe %v), want a probe", err, p.Probe())
				}
				wantState(t, b, breaker.HalfOpen)
				if _, err := b.Allow(); err != breaker.ErrTooManyProbes || !errors.Is(err, breaker.ErrOpen) {
					t.Fatalf("second Allow while probing = %v, want ErrTooManyProbes", err)
				}
				p.Done(tc.probe, 0)
				wantState(t, b, tc.want)
				if tc.want == breaker.Open {
					_, err := b.Allow()
					if !errors.As(err, &oe) || !oe.Until.Equal(time.Now().Add(openFor)) {
						t.Fatalf("after failed probe Allow = %v, want open for another %v", err, openFor)
					}
				} else if n := calls(b, breaker.Success, 10); n != 10 {
					t.Fatalf("closed breaker admitted %d of 10", n)
				}
			})
		})
	}
}

// Comparisons are inclusive and exact for decimal rates: 11 of 20 is 0.55.
func TestThresholdsInclusive(t *testing.T) {
	for _, tc := range []struct {
		name                string
		failures, successes int
		want                breaker.State
	}{
		{"11 of 20 >= 0.55", 11, 9, breaker.Open},
		{"10 of 20 < 0.55", 10, 10, breaker.Closed},
		{"11 of 19: below MinRequests", 11, 8, breaker.Closed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := mustNew(breaker.Config{FailureRate: 0.55, MinRequests: 20})
				calls(b, breaker.Success, tc.successes)
				calls(b, breaker.Failure, tc.failures)
				wantState(t, b, tc.want)
			})
		})
	}
}

// A success never trips the breaker: the rate is evaluated when a failure
// or a slow call is recorded.
func TestSuccessNeverTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(breaker.Config{MinRequests: 4})
		calls(b, breaker.Failure, 3) // 3 calls: under the minimum
		calls(b, breaker.Success, 1) // 4 calls, rate 0.75: a success does not trip
		wantState(t, b, breaker.Closed)
		calls(b, breaker.Failure, 1)
		wantState(t, b, breaker.Open)
	})
}

func TestTimeWindowSlides(t *testing.T) {
	for _, tc := range []struct {
		name string
		gap  time.Duration
		want breaker.State
	}{
		// 10 failures, a gap, 10 failures: with MinRequests 20 it trips only
		// when the first ten are still in the 10 s window.
		{"inside the window", 8 * time.Second, breaker.Open},
		{"past the window", 11 * time.Second, breaker.Closed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				b := mustNew(breaker.Config{})
				calls(b, breaker.Failure, 10)
				time.Sleep(tc.gap)
				calls(b, breaker.Failure, 10)
				wantState(t, b, tc.want)
				if tc.want == breaker.Closed {
					if m := b.Metrics(); m.Calls != 10 || m.Failures != 10 {
						t.Fatalf("window holds %d calls %d failures, want 10 and 10", m.Calls, m.Failures)
					}
				}
			})
		})
	}
}

// The window slides a bucket at a time, without calls moving it.
func TestTimeWindowExpiresWithoutCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(breaker.Config{Window: 10 * time.Second, Buckets: 10})
		for range 5 {
			calls(b, breaker.Success, 2)
			time.Sleep(time.Second)
		}
		// Calls at t=0,1,2,3,4 s; now t=5 s.
		if got := b.Metrics().Calls; got != 10 {
			t.Fatalf("calls = %d, want 10", got)
		}
		time.Sleep(6 * time.Second) // t=11 s: the t=0 and t=1 buckets have left
		if got := b.Metrics().Calls; got != 6 {
			t.Fatalf("calls = %d, want 6", got)
		}
		time.Sleep(time.Hour)
		if got := b.Metrics().Calls; got != 0 {
			t.Fatalf("calls after an hour = %d, want 0", got)
		}
	})
}

func TestCountWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(breaker.Config{CountWindow: 4, MinRequests: 4, FailureRate: 0.75})
		calls(b, breaker.Success, 4)
		calls(b, breaker.Failure, 2) // S S F F: 0.5
		wantState(t, b, breaker.Closed)
		if m := b.Metrics(); m.Calls != 4 || m.Failures != 2 {
			t.Fatalf("window = %d calls %d failures, want 4 and 2", m.Calls, m.Failures)
		}
		time.Sleep(time.Hour)        // a count window does not expire with time
		calls(b, breaker.Failure, 1) // S F F F: 0.75
		wantState(t, b, breaker.Open)
	})
}

func TestSlowCallRateTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		b := mustNew(breaker.Config{
			MinRequests: 10, SlowCall: time.Second, SlowRate: 0.5, Observer: r,
		})
		slowCall := func() error { time.Sleep(1200 * time.Millisecond); return nil }
		fastCall := func() error { time.Sleep(100 * time.Millisecond); return nil }
		for range 5 {
			b.Execute(fastCall)
		}
		for range 4 {
			b.Execute(slowCall)
		}
		wantState(t, b, breaker.Closed) // 9 calls
		if m := b.Metrics(); m.Slow != 4 || m.Failures != 0 {
			t.Fatalf("window: slow=%d failures=%d, want 4 and 0", m.Slow, m.Failures)
		}
		b.Execute(slowCall) // 10 calls, 5 slow: 0.5
		wantState(t, b, breaker.Open)
		ts := r.list()
		if len(ts) != 1 || ts[0].Reason != string(breaker.ReasonSlowRate) {
			t.Fatalf("transitions = %+v, want one slow_rate trip", ts)
		}
		if want := "slow-call rate 0.5 of 10 calls >= 0.5"; ts[0].Detail != want {
			t.Fatalf("cause = %q, want %q", ts[0].Detail, want)
		}
	})
}

func TestSlowProbeReopens(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		b := mustNew(breaker.Config{MinRequests: 1, SlowCall: time.Second, OpenJitter: -1, Observer: r})
		trip(t, b, 1)
		time.Sleep(defaultOpenFor)
		p, err := b.Allow()
		if err != nil {
			t.Fatal(err)
		}
		p.Done(breaker.Success, 2*time.Second)
		wantState(t, b, breaker.Open)
		if got, want := r.path(), "closed>open(failure_rate) open>half_open(open_elapsed) half_open>open(probe_slow)"; got != want {
			t.Fatalf("transitions %s, want %s", got, want)
		}
	})
}

func TestMetricsOnlyNeverTrips(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		b := mustNew(breaker.Config{Mode: breaker.MetricsOnly, MinRequests: 1, Observer: r})
		if n := calls(b, breaker.Failure, 100); n != 100 {
			t.Fatalf("admitted %d of 100", n)
		}
		wantState(t, b, breaker.Closed)
		m := b.Metrics()
		if m.Calls != 100 || m.Failures != 100 || m.FailureRate != 1 || !m.Forced {
			t.Fatalf("metrics = %+v, want 100 failures of 100, forced", m)
		}
		if ts := r.list(); len(ts) != 0 {
			t.Fatalf("transitions %v, want none", ts)
		}
	})
}

func TestDisabledAdmitsAndRecordsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(breaker.Config{Mode: breaker.Disabled, MinRequests: 1})
		if n := calls(b, breaker.Failure, 100); n != 100 {
			t.Fatalf("admitted %d of 100", n)
		}
		if m := b.Metrics(); m.Calls != 0 || m.State != breaker.Closed {
			t.Fatalf("metrics = %+v, want nothing recorded", m)
		}
	})
}

func TestForcedStates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		b := mustNew(breaker.Config{MinRequests: 1, Observer: r})

		b.ForceOpen()
		time.Sleep(time.Hour) // never probes by itself
		_, err := b.Allow()
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || !oe.Until.IsZero() || oe.RetryIn() != 0 {
			t.Fatalf("forced open Allow = %v, want an *OpenError with no Until", err)
		}
		if m := b.Metrics(); m.State != breaker.Open || !m.Forced {
			t.Fatalf("metrics = %+v, want forced open", m)
		}

		b.ForceClosed()
		if n := calls(b, breaker.Failure, 50); n != 50 {
			t.Fatalf("forced closed admitted %d of 50", n)
		}
		wantState(t, b, breaker.Closed)
		if got := b.Metrics().Failures; got != 50 {
			t.Fatalf("forced closed recorded %d failures, want 50", got)
		}

		b.Reset()
		calls(b, breaker.Failure, 1)
		wantState(t, b, breaker.Open) // normal again: trips

		want := "closed>open(forced_open) open>closed(forced_closed) closed>closed(reset) closed>open(failure_rate)"
		if got := r.path(); got != want {
			t.Fatalf("transitions %s\nwant %s", got, want)
		}
	})
}

func TestResetForgetsOpenings(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		b := mustNew(breaker.Config{MinRequests: 1, OpenBackoff: 2, OpenJitter: -1, Observer: r})
		trip(t, b, 1)
		b.Reset()
		b.Reset() // closed already: no transition
		trip(t, b, 1)
		ts := r.list()
		if len(ts) != 3 || ts[2].Delay != defaultOpenFor {
			t.Fatalf("transitions %+v, want the second opening to count as the first", ts)
		}
	})
}

func TestOpenBackoffGrowsAndCaps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		b := mustNew(breaker.Config{
			MinRequests: 1, OpenFor: time.Second, OpenBackoff: 2, MaxOpenFor: 5 * time.Second,
			OpenJitter: -1, Observer: r,
		})
		trip(t, b, 1)
		for range 4 { // four failed probes
			time.Sleep(time.Minute)
			calls(b, breaker.Failure, 1)
		}
		time.Sleep(time.Minute)
		calls(b, breaker.Success, 1) // closes
		trip(t, b, 1)
		var got []time.Duration
		for _, tr := range r.list() {
			if tr.To == "open" {
				got = append(got, tr.Delay)
			}
		}
		want := []time.Duration{1, 2, 4, 5, 5, 1}
		for i := range want {
			want[i] *= time.Second
		}
		if len(got) != len(want) {
			t.Fatalf("open times %v, want %v", got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("open times %v, want %v", got, want)
			}
		}
	})
}

// Open times of 100 breakers tripped together spread over
// [OpenFor, OpenFor*(1+OpenJitter)], so they do not probe in lockstep.
func TestOpenJitterSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const openFor, jitter = 30 * time.Second, 0.2
		src := rand.New(rand.NewPCG(1, 2))
		for _, rnd := range []func() float64{src.Float64, nil} { // seeded, and the default source
			const n, bins = 100, 5
			var hist [bins]int
			lo, hi := time.Duration(1<<62), time.Duration(0)
			start := time.Now()
			for range n {
				b := mustNew(breaker.Config{MinRequests: 1, OpenFor: openFor, OpenJitter: jitter, Rand: rnd})
				trip(t, b, 1)
				d := b.Metrics().OpenUntil.Sub(start)
				if d < openFor || d > openFor+time.Duration(jitter*float64(openFor)) {
					t.Fatalf("open time %v outside [%v, %v]", d, openFor, openFor*6/5)
				}
				lo, hi = min(lo, d), max(hi, d)
				hist[int(float64(d-openFor)/(jitter*float64(openFor))*bins)]++
			}
			// Each fifth of the range holds ~20 of 100; fewer than 5 has
			// probability below 1e-4 for a uniform source.
			for i, c := range hist {
				if c < 5 {
					t.Fatalf("bin %d of the jitter range holds %d of %d open times: %v", i, c, n, hist)
				}
			}
			if hi-lo < 5*time.Second {
				t.Fatalf("open times span only %v (%v..%v)", hi-lo, lo, hi)
			}
		}
	})
}

// A result that arrives from an earlier state is dropped.
func TestLateResultDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		b := mustNew(breaker.Config{MinRequests: 2, OpenJitter: -1, Observer: r})
		slow, err := b.Allow() // a slow call started while closed
		if err != nil {
			t.Fatal(err)
		}
		trip(t, b, 2)

		slow.Done(breaker.Failure, 0) // ends while open
		time.Sleep(defaultOpenFor)
		probe, err := b.Allow()
		if err != nil {
			t.Fatal(err)
		}
		slow.Done(breaker.Failure, 0) // ends while half-open: not a probe result
		wantState(t, b, breaker.HalfOpen)
		probe.Done(breaker.Success, 0)
		wantState(t, b, breaker.Closed)

		slow.Done(breaker.Failure, 0) // ends after re-closing: not in the new window
		if m := b.Metrics(); m.Calls != 0 {
			t.Fatalf("new window holds %d calls, want 0", m.Calls)
		}
		probe.Done(breaker.Failure, 0) // a stale probe result
		wantState(t, b, breaker.Closed)
		if got, want := r.path(), "closed>open(failure_rate) open>half_open(open_elapsed) half_open>closed(probes_passed)"; got != want {
			t.Fatalf("transitions %s, want %s", got, want)
		}
	})
}

// A probe whose caller gave up (Ignored) frees its slot; a probe that never
// reports is presumed lost after OpenFor and the breaker opens again.
func TestLostProbeDoesNotWedge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const openFor = 10 * time.Second
		r := &recorder{}
		b := mustNew(breaker.Config{MinRequests: 1, OpenFor: openFor, OpenJitter: -1, Observer: r})
		trip(t, b, 1)
		time.Sleep(openFor)

		p, err := b.Allow()
		if err != nil {
			t.Fatal(err)
		}
		p.Done(breaker.Ignored, 0) // caller cancelled
		p, err = b.Allow()
		if err != nil || !p.Probe() {
			t.Fatalf("Allow after a cancelled probe = %v, want the freed probe slot", err)
		}
		if m := b.Metrics(); m.Probes != 1 || m.State != breaker.HalfOpen {
			t.Fatalf("metrics = %+v, want 1 probe in flight", m)
		}

		// p never reports.
		time.Sleep(openFor - time.Millisecond)
		if _, err := b.Allow(); err != breaker.ErrTooManyProbes {
			t.Fatalf("Allow with the probe out = %v, want ErrTooManyProbes", err)
		}
		time.Sleep(time.Millisecond)
		_, err = b.Allow()
		var oe *breaker.OpenError
		if !errors.As(err, &oe) || oe.RetryIn() != openFor {
			t.Fatalf("Allow after the probe was lost = %v, want open for %v", err, openFor)
		}
		p.Done(breaker.Success, 0) // too late: dropped
		wantState(t, b, breaker.Open)

		time.Sleep(openFor)
		p, err = b.Allow()
		if err != nil {
			t.Fatalf("Allow after the second open period = %v", err)
		}
		p.Done(breaker.Success, 0)
		wantState(t, b, breaker.Closed)
		want := "closed>open(failure_rate) open>half_open(open_elapsed) half_open>open(probe_timeout) open>half_open(open_elapsed) half_open>closed(probes_passed)"
		if got := r.path(); got != want {
			t.Fatalf("transitions %s\nwant %s", got, want)
		}
	})
}

func TestCloseAfterConsecutiveProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(breaker.Config{MinRequests: 1, HalfOpenProbes: 2, CloseAfter: 3, OpenJitter: -1})
		trip(t, b, 1)
		time.Sleep(defaultOpenFor)
		p1, _ := b.Allow()
		p2, _ := b.Allow()
		if _, err := b.Allow(); err != breaker.ErrTooManyProbes {
			t.Fatalf("third concurrent probe: %v, want ErrTooManyProbes", err)
		}
		p1.Done(breaker.Success, 0)
		p2.Done(breaker.Success, 0)
		wantState(t, b, breaker.HalfOpen) // 2 of 3
		p3, _ := b.Allow()
		p3.Done(breaker.Ignored, 0) // does not count, does not reset
		p4, _ := b.Allow()
		p4.Done(breaker.Success, 0)
		wantState(t, b, breaker.Closed)
	})
}

func TestDefaultCloseAfterIsProbes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(breaker.Config{MinRequests: 1, HalfOpenProbes: 3, OpenJitter: -1})
		trip(t, b, 1)
		time.Sleep(defaultOpenFor)
		ps := make([]breaker.Permit, 3)
		for i := range ps {
			ps[i], _ = b.Allow()
		}
		ps[0].Done(breaker.Success, 0)
		ps[1].Done(breaker.Success, 0)
		wantState(t, b, breaker.HalfOpen)
		ps[2].Done(breaker.Success, 0)
		wantState(t, b, breaker.Closed)
	})
}

// The Observer is called in order, outside the lock: it may call the
// breaker, even change its state.
func TestObserverReentrant(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		var b *breaker.Breaker
		b = mustNew(breaker.Config{MinRequests: 1, Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			r.Observe(ctx, e)
			if e.Reason == string(breaker.ReasonFailureRate) {
				_ = b.State()
				b.ForceClosed() // an operator's hook overriding the trip
			}
			return ctx
		})})
		calls(b, breaker.Failure, 1)
		wantState(t, b, breaker.Closed)
		if got, want := r.path(), "closed>open(failure_rate) open>closed(forced_closed)"; got != want {
			t.Fatalf("transitions %s, want %s", got, want)
		}
	})
}

func TestObserverPanicDoesNotWedge(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		n := 0
		b := mustNew(breaker.Config{MinRequests: 1, Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			n++
			if n == 1 {
				panic("hook bug")
			}
			return ctx
		})})
		func() {
			defer func() { recover() }()
			calls(b, breaker.Failure, 1)
		}()
		wantState(t, b, breaker.Open)
		b.Reset() // must not deadlock, and must be delivered
		if n != 2 {
			t.Fatalf("hook called %d times, want 2", n)
		}
	})
}

func TestTransitionDetails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		b := mustNew(breaker.Config{Name: "pricing", OpenFor: time.Second, OpenJitter: -1, Observer: r})
		calls(b, breaker.Success, 9)
		calls(b, breaker.Failure, 11)
		ts := r.list()
		if len(ts) != 1 {
			t.Fatalf("transitions %+v, want 1", ts)
		}
		tr := ts[0]
		if tr.Kind != event.BreakerTransition || tr.Dependency != "pricing" || tr.From != "closed" || tr.To != "open" ||
			tr.Reason != "failure_rate" || tr.Delay != time.Second || tr.Remaining != -1 ||
			tr.Detail != "failure rate 0.55 of 20 calls >= 0.5" {
			t.Fatalf("transition %+v", tr)
		}
		_, err := b.Allow()
		if got, want := err.Error(), `breaker "pricing": open until `; !strings.HasPrefix(got, want) {
			t.Fatalf("error %q, want prefix %q", got, want)
		}
	})
}

func TestExecute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(breaker.Config{MinRequests: 1})
		if err := b.Execute(func() error { return nil }); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := b.Execute(ctx.Err); err != context.Canceled {
			t.Fatalf("Execute = %v", err)
		}
		if m := b.Metrics(); m.Calls != 1 {
			t.Fatalf("calls = %d, want 1 (cancellation ignored)", m.Calls)
		}
		if err := b.Execute(func() error { return errBoom }); err != errBoom {
			t.Fatalf("Execute = %v", err)
		}
		ran := false
		if err := b.Execute(func() error { ran = true; return nil }); !errors.Is(err, breaker.ErrOpen) || ran {
			t.Fatalf("Execute while open = %v (ran %v), want ErrOpen without running", err, ran)
		}
	})
}

// A panic in Execute counts as a failure, as in guardrail.Do, and goes
// on: panics trip a closed breaker, and a probe that panics re-opens it.
func TestExecutePanicCountsAsFailure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(breaker.Config{MinRequests: 2, OpenJitter: -1})
		panics := func() {
			t.Helper()
			defer func() {
				if recover() == nil {
					t.Fatal("panic swallowed")
				}
			}()
			b.Execute(func() error { panic("bug") })
		}
		panics()
		wantState(t, b, breaker.Closed)
		if m := b.Metrics(); m.Calls != 1 || m.Failures != 1 {
			t.Errorf("window after a panic: %d calls, %d failures; want 1, 1", m.Calls, m.Failures)
		}
		panics()
		wantState(t, b, breaker.Open)
		time.Sleep(defaultOpenFor)
		panics() // the probe
		wantState(t, b, breaker.Open)
		time.Sleep(defaultOpenFor)
		if err := b.Execute(func() error { return nil }); err != nil {
			t.Fatalf("next probe = %v, want admitted", err)
		}
		wantState(t, b, breaker.Closed)
	})
}

func TestZeroPermitIsNoop(t *testing.T) {
	var p breaker.Permit
	p.Done(breaker.Failure, time.Hour)
	p.DoneAt(breaker.Failure, time.Hour, time.Now())
	if p.Probe() {
		t.Fatal("zero permit is a probe")
	}
}

// AllowAt and DoneAt run the breaker on a caller's clock.
func TestAtTwins(t *testing.T) {
	b := mustNew(breaker.Config{MinRequests: 1, OpenFor: time.Second, OpenJitter: -1})
	t0 := time.Now()
	p, _ := b.AllowAt(t0)
	p.DoneAt(breaker.Failure, 0, t0)
	if _, err := b.AllowAt(t0.Add(999 * time.Millisecond)); !errors.Is(err, breaker.ErrOpen) {
		t.Fatalf("AllowAt before OpenFor = %v, want ErrOpen", err)
	}
	p, err := b.AllowAt(t0.Add(time.Second))
	if err != nil || !p.Probe() {
		t.Fatalf("AllowAt at OpenFor = %v, want a probe", err)
	}
	p.DoneAt(breaker.Success, 0, t0.Add(time.Second))
	wantState(t, b, breaker.Closed)
}

// Invalid values are rejected, each by name, rather than replaced: a
// mistyped threshold must not quietly become another one.
func TestInvalidConfigIsRejected(t *testing.T) {
	nan := math.NaN()
	for _, tc := range []struct {
		cfg  breaker.Config
		want []string
	}{
		{breaker.Config{FailureRate: nan}, []string{"breaker: Config.FailureRate is NaN; want a value in (0, 1], or zero for the default"}},
		{breaker.Config{FailureRate: -1}, []string{"Config.FailureRate is -1;"}},
		{breaker.Config{FailureRate: 1.5}, []string{"breaker: Config.FailureRate is 1.5; want a value in (0, 1]"}},
		{breaker.Config{SlowRate: 2}, []string{"Config.SlowRate is 2;"}},
		{breaker.Config{Window: -time.Second, Buckets: -3}, []string{"Config.Window is -1s;", "Config.Buckets is -3;"}},
		{breaker.Config{Buckets: 1001}, []string{"Config.Buckets is 1001; want 1 to 1000"}},
		{breaker.Config{Window: 5, Buckets: 10}, []string{"Config.Buckets is 10; want at most Window in nanoseconds (5)"}},
		{breaker.Config{CountWindow: -1}, []string{"Config.CountWindow is -1;"}},
		{breaker.Config{CountWindow: 1<<20 + 1}, []string{"Config.CountWindow is 1048577;"}},
		{breaker.Config{MinRequests: -1}, []string{"Config.MinRequests is -1;"}},
		{breaker.Config{MinRequests: 6, CountWindow: 5}, []string{"Config.MinRequests is 6; want at most CountWindow (5)"}},
		{breaker.Config{SlowCall: -time.Second}, []string{"Config.SlowCall is -1s;"}},
		{breaker.Config{OpenFor: -time.Second, OpenJitter: nan, HalfOpenProbes: -1, CloseAfter: -1},
			[]string{"Config.OpenFor is -1s;", "Config.OpenJitter is NaN;", "Config.HalfOpenProbes is -1;", "Config.CloseAfter is -1;"}},
		{breaker.Config{OpenJitter: 1.5}, []string{"Config.OpenJitter is 1.5; want a value in (0, 1], zero for the default or negative for none"}},
		{breaker.Config{OpenBackoff: 0.5}, []string{"Config.OpenBackoff is 0.5;"}},
		{breaker.Config{OpenBackoff: math.Inf(1)}, []string{"Config.OpenBackoff is +Inf;"}},
		{breaker.Config{OpenFor: time.Minute, MaxOpenFor: time.Second}, []string{"Config.MaxOpenFor is 1s; want at least OpenFor (1m0s)"}},
		{breaker.Config{MaxOpenFor: -1}, []string{"Config.MaxOpenFor is -1ns;"}},
		{breaker.Config{Mode: 42}, []string{"Config.Mode is 42; want Normal, MetricsOnly or Disabled"}},
		{breaker.Config{CountWindow: -1, FailureRate: 2, CloseAfter: -2, Mode: 9},
			[]string{"Config.CountWindow is -1;", "Config.FailureRate is 2;", "Config.CloseAfter is -2;", "Config.Mode is 9;"}},
	} {
		b, err := breaker.New(tc.cfg)
		if b != nil || !errors.Is(err, breaker.ErrInvalidConfig) {
			t.Errorf("New(%+v) = %v, %v; want nil and ErrInvalidConfig", tc.cfg, b, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("New(%+v): %q does not say %q", tc.cfg, err, w)
			}
		}
		if n := strings.Count(err.Error(), "\n") + 1; n != len(tc.want) {
			t.Errorf("New(%+v): %d errors in %q, want %d", tc.cfg, n, err, len(tc.want))
		}
		_, err = breaker.NewGroup(breaker.GroupConfig{Config: tc.cfg})
		if !errors.Is(err, breaker.ErrInvalidConfig) || !strings.Contains(err.Error(), "breaker: GroupConfig.Config.") {
			t.Errorf("NewGroup with Config %+v: %v; want the field named in GroupConfig.Config", tc.cfg, err)
		}
	}
	if _, err := breaker.NewGroup(breaker.GroupConfig{MaxKeys: -1}); !errors.Is(err, breaker.ErrInvalidConfig) ||
		err.Error() != "breaker: GroupConfig.MaxKeys is -1; want a positive count, or zero for the default" {
		t.Errorf("NewGroup MaxKeys -1: %v", err)
	}
}

// Boundary values that are allowed.
func TestValidConfigBoundaries(t *testing.T) {
	for _, cfg := range []breaker.Config{
		{FailureRate: 1, SlowRate: 1, OpenJitter: 1},
		{OpenBackoff: 1},
		{MinRequests: 5, CountWindow: 5},
		{Buckets: 1000, CountWindow: 1 << 20},
		{Window: 5}, // fewer nanoseconds than the default bucket count
		{OpenJitter: -1},
		{OpenFor: time.Second, MaxOpenFor: time.Second},
	} {
		if _, err := breaker.New(cfg); err != nil {
			t.Errorf("New(%+v): %v", cfg, err)
		}
	}
}

// A ConfigFor that returns an invalid Config is a programming error: Get
// panics with the field named, instead of running the key on other values.
func TestGroupConfigForInvalid(t *testing.T) {
	g := mustGroup(breaker.GroupConfig{ConfigFor: func(key string) breaker.Config {
		return breaker.Config{FailureRate: 2}
	}})
	defer func() {
		err, _ := recover().(error)
		if !errors.Is(err, breaker.ErrInvalidConfig) || !strings.Contains(err.Error(), `breaker: ConfigFor("eu").FailureRate is 2;`) {
			t.Fatalf("recovered %v, want the invalid field", err)
		}
	}()
	g.Get("eu")
}

func TestDefaultConfigMatchesZero(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := func() float64 { return 0.5 }
		z, d := breaker.Config{Rand: src}, breaker.DefaultConfig()
		d.Rand = src
		var got [2]time.Time
		for i, cfg := range []breaker.Config{z, d} {
			b := mustNew(cfg)
			calls(b, breaker.Success, 10)
			calls(b, breaker.Failure, 10)
			got[i] = b.Metrics().OpenUntil
		}
		if got[0].IsZero() || !got[0].Equal(got[1]) {
			t.Fatalf("zero config opens until %v, DefaultConfig until %v", got[0], got[1])
		}
	})
}

func TestName(t *testing.T) {
	if got := mustNew(breaker.Config{Name: "db"}).Config().Name; got != "db" {
		t.Fatalf("Config().Name = %q", got)
	}
}

// The Observer sees every transition, as an event named after the
// breaker.
func TestObserver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var got []string
		b := mustNew(breaker.Config{Name: "pricing", MinRequests: 1,
			Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
				if e.Kind != event.BreakerTransition || e.Dependency != "pricing" {
					t.Errorf("event %+v, want a breaker transition of pricing", e)
				}
				got = append(got, "observer:"+e.From+">"+e.To+":"+e.Reason)
				return ctx
			}),
		})
		calls(b, breaker.Failure, 1)
		b.Reset()
		b.ForceOpen()
		want := "observer:closed>open:failure_rate observer:open>closed:reset observer:closed>open:forced_open"
		if s := strings.Join(got, " "); s != want {
			t.Fatalf("delivered %s\nwant      %s", s, want)
		}
	})
}

func TestTransitionRates(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{}
		b := mustNew(breaker.Config{MinRequests: 4, SlowCall: time.Second, Observer: r})
		p, _ := b.Allow()
		p.Done(breaker.Success, 2*time.Second)
		calls(b, breaker.Success, 1)
		calls(b, breaker.Failure, 2)
		ts := r.list()
		if len(ts) != 1 || ts[0].Detail != "failure rate 0.5 of 4 calls >= 0.5" || ts[0].Reason != string(breaker.ReasonFailureRate) {
			t.Fatalf("transitions %+v, want a trip on a failure rate of 0.5", ts)
		}
	})
}

func TestErrorMessages(t *testing.T) {
	if got, want := breaker.ErrTooManyProbes.Error(), "breaker: half-open, all probe slots taken"; got != want {
		t.Fatalf("ErrTooManyProbes = %q, want %q", got, want)
	}
	if got, want := breaker.ErrOpen.Error(), "breaker: open"; got != want {
		t.Fatalf("ErrOpen = %q, want %q", got, want)
	}
	b := mustNew(breaker.Config{Name: "a\nb"})
	b.ForceOpen()
	_, err := b.Allow()
	if got, want := err.Error(), `breaker "a\nb": open (forced)`; got != want {
		t.Fatalf("error = %q, want %q", got, want)
	}
}

// Execute measures the probe's duration itself: a slow probe re-opens.
func TestExecuteSlowProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := mustNew(breaker.Config{MinRequests: 1, SlowCall: time.Second, OpenJitter: -1})
		trip(t, b, 1)
		time.Sleep(defaultOpenFor)
		b.Execute(func() error { time.Sleep(time.Second); return nil })
		wantState(t, b, breaker.Open)
		time.Sleep(defaultOpenFor)
		b.Execute(func() error { time.Sleep(999 * time.Millisecond); return nil })
		wantState(t, b, breaker.Closed)
	})
}

// A count window smaller than the default minimum volume still trips.
func TestCountWindowCapsMinRequests(t *testing.T) {
	b := mustNew(breaker.Config{CountWindow: 5})
	calls(b, breaker.Failure, 4)
	wantState(t, b, breaker.Closed)
	calls(b, breaker.Failure, 1)
	wantState(t, b, breaker.Open)
}

func TestConfigReportsTheEffectiveSettings(t *testing.T) {
	b := mustNew(breaker.Config{Name: "pricing", OpenJitter: -1, CountWindow: 2})
	c := b.Config()
	if c.Window != breaker.DefaultWindow || c.FailureRate != 0.5 || c.OpenFor != 30*time.Second ||
		c.MinRequests != 2 || c.OpenJitter != -1 || c.HalfOpenProbes != 1 || c.CloseAfter != 1 || c.Name != "pricing" {
		t.Fatalf("effective config = %+v", c)
	}
	if _, err := breaker.New(c); err != nil {
		t.Fatalf("New(Config()) = %v; the effective config must be valid", err)
	}
	var buf strings.Builder
	slog.New(slog.NewTextHandler(&buf, nil)).Info("t", "breaker", c)
	for _, want := range []string{"breaker.window=10s", "breaker.min_requests=2", "breaker.failure_rate=0.5", "breaker.count_window=2", "breaker.mode=normal"} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("log line %q lacks %q", buf.String(), want)
		}
	}
}
