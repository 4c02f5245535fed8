package guardrail

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/budget"
)

var errReset = errors.New("connection reset")

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
