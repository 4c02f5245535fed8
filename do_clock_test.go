package guardrail

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
)

// countReads runs fn with clockReads counting, and returns the count: the
// clock reads Do made plus the calls into the breaker that may read it.
// The attempt timer's own reads, inside package context, are not counted.
func countReads(t *testing.T, fn func()) int64 {
	t.Helper()
	var n atomic.Int64
	clockReads = func() { n.Add(1) }
	defer func() { clockReads = nil }()
	fn()
	return n.Load()
}

var errReset = errors.New("connection reset")

// TestClockReadsPerAttempt pins how many times one call reads the clock:
// at most once per attempt with the Policy's breaker, whatever the
// deadline, attempt timeout and outcome, except with a deadline too far
// away to bound the attempt, or none with a throttle (then the end of the
// last attempt is read too: a result recorded at its start could leave
// the window before its time), and with an observer (an attempt's
// duration takes its start and its end).
func TestClockReadsPerAttempt(t *testing.T) {
	transient, permanent := Transient(errReset), Permanent(errReset)
	outcomes := []struct {
		name     string
		attempts int     // MaxAttempts
		errs     []error // attempt i returns errs[i]
	}{
		{"ok", 3, []error{nil}},
		{"ok-third", 3, []error{transient, transient, nil}},
		{"fail-once", 1, []error{transient}},
		{"fail-thrice", 3, []error{transient, transient, transient}},
		{"permanent", 3, []error{permanent}},
	}
	setups := []struct {
		name     string
		deadline time.Duration // 0: none
		timeout  time.Duration // AttemptTimeout
		observed bool
		throttle bool
		want     []int // per outcome
	}{
		{name: "no-deadline", want: []int{1, 3, 1, 3, 0}},
		// Within one bucket of the breaker's window (1 s): results are
		// recorded at their attempt's start, retries start when their wait
		// ends, and the read that ends a failed attempt decides the retry.
		{name: "deadline=500ms", deadline: 500 * time.Millisecond, want: []int{1, 3, 1, 3, 1}},
		{name: "deadline=1h", deadline: time.Hour, want: []int{2, 4, 2, 4, 1}},
		{name: "deadline=1h/timeout=100ms", deadline: time.Hour, timeout: 100 * time.Millisecond, want: []int{1, 3, 1, 3, 1}},
		// The attempt timer's reading (WithTimeout's) is the attempt's start.
		{name: "timeout=100ms", timeout: 100 * time.Millisecond, want: []int{0, 0, 0, 0, 0}},
		{name: "deadline=500ms/throttle", deadline: 500 * time.Millisecond, throttle: true, want: []int{1, 3, 1, 3, 1}},
		{name: "no-deadline/throttle", throttle: true, want: []int{2, 4, 2, 4, 2}},
		{name: "deadline=1h/observed", deadline: time.Hour, observed: true, want: []int{2, 6, 2, 6, 2}},
	}
	for _, su := range setups {
		for i, oc := range outcomes {
			t.Run(su.name+"/"+oc.name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					p := &Policy{Retry: Retry{
						MaxAttempts:    oc.attempts,
						AttemptTimeout: su.timeout,
						Budget:         budget.Unlimited(),
						Backoff:        backoff.Constant(10 * time.Millisecond),
					},
						Idempotent: true,
					}
					if su.observed {
						p.Observer = event.ObserverFunc(func(ctx context.Context, _ event.Event) context.Context { return ctx })
					}
					if su.throttle {
						p.Throttler = must(NewThrottler(ThrottleConfig{}))
					}
					ctx := context.Background()
					if su.deadline > 0 {
						var cancel context.CancelFunc
						ctx, cancel = context.WithTimeout(ctx, su.deadline)
						defer cancel()
					}
					calls := 0
					op := func(context.Context) (int, error) {
						err := oc.errs[min(calls, len(oc.errs)-1)]
						calls++
						return calls, err
					}
					var err error
					got := countReads(t, func() { _, err = Do(ctx, p, op) })
					if wantErr := oc.errs[len(oc.errs)-1]; !errors.Is(err, wantErr) && (wantErr != nil || err != nil) {
						t.Fatalf("Do: %v; want %v", err, wantErr)
					}
					if calls != len(oc.errs) {
						t.Fatalf("%d attempts; want %d", calls, len(oc.errs))
					}
					if want := su.want[i]; got != int64(want) {
						t.Errorf("%d clock reads for %d attempts; want %d", got, calls, want)
					}
					limit := calls
					switch {
					case su.observed:
						limit = 2 * calls
					case su.timeout == 0 && (su.deadline > time.Second || su.deadline == 0 && su.throttle):
						// Nothing bounds the attempt: its end is read.
						limit = calls + 1
					}
					if got > int64(limit) {
						t.Errorf("%d clock reads for %d attempts; want at most %d", got, calls, limit)
					}
				})
			})
		}
	}
}

// TestRetryStartsWhenItsWaitEnds: a retry derives its start from the
// previous attempt's end and the delay, so the time it sees left is the
// time really left (in a bubble, where timers are exact).
func TestRetryStartsWhenItsWaitEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &Policy{Idempotent: true, Retry: Retry{
			Budget:         budget.Unlimited(),
			Backoff:        backoff.Constant(100 * time.Millisecond),
			MaxAttempts:    5,
			MinAttemptTime: 50 * time.Millisecond,
		},
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		var left []time.Duration
		op := func(ctx context.Context) (int, error) {
			dl, _ := ctx.Deadline()
			left = append(left, time.Until(dl))
			time.Sleep(200 * time.Millisecond)
			return 0, Transient(errReset)
		}
		_, err := Do(ctx, p, op)
		// Attempts at 0, 300, 600 ms; at 800 ms 200 ms are left, and a
		// retry needs 100 + 50: granted, and at 900 ms 100 ms are left.
		want := []time.Duration{time.Second, 700 * time.Millisecond, 400 * time.Millisecond, 100 * time.Millisecond}
		if fmt.Sprint(left) != fmt.Sprint(want) {
			t.Errorf("time left at each attempt: %v; want %v", left, want)
		}
		if !errors.Is(err, ErrDeadline) {
			t.Errorf("Do: %v; want ErrDeadline", err)
		}
	})
}

// TestLongAttemptStaysInTheWindow: a result is recorded at its attempt's
// start only when the context bounds the attempt to one bucket of the
// breaker's window. A success that took longer than the window is still
// in the window when the call returns, and so is one bounded by a near
// deadline; 10 s later both have left it.
func TestLongAttemptStaysInTheWindow(t *testing.T) {
	for _, tc := range []struct {
		name           string
		deadline, took time.Duration
	}{
		{"deadline=1h/took=12s", time.Hour, 12 * time.Second},
		{"deadline=900ms/took=800ms", 900 * time.Millisecond, 800 * time.Millisecond},
		{"deadline=none/took=12s", 0, 12 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := &Policy{}
				ctx := context.Background()
				if tc.deadline > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tc.deadline)
					defer cancel()
				}
				op := func(context.Context) (int, error) {
					time.Sleep(tc.took)
					return 1, nil
				}
				if _, err := Do(ctx, p, op); err != nil {
					t.Fatal(err)
				}
				if got := p.BreakerInUse().Metrics().Calls; got != 1 {
					t.Errorf("calls in the window when Do returned: %d; want 1", got)
				}
				time.Sleep(10 * time.Second)
				if got := p.BreakerInUse().Metrics().Calls; got != 0 {
					t.Errorf("calls in the window 10 s later: %d; want 0", got)
				}
			})
		})
	}
}
