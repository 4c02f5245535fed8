package guardrail_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/throttle"
)

// TestCallOverridesThePolicy: each per-call setting replaces the Policy's
// for that call alone, so an adapter never builds a second Policy.
func TestCallOverridesThePolicy(t *testing.T) {
	p := unlimited()
	p.MaxAttempts = 5
	transient := guardrail.Transient(errBoom)

	dep := &counter{errs: []error{transient}}
	_, _ = guardrail.DoCall(context.Background(), p, guardrail.Call{MaxAttempts: 2}, dep.op)
	if dep.calls != 2 {
		t.Errorf("Call.MaxAttempts 2 over a Policy of 5: %d calls; want 2", dep.calls)
	}
	dep = &counter{errs: []error{transient}}
	_, _ = guardrail.Do(context.Background(), p, dep.op)
	if dep.calls != 5 {
		t.Errorf("the Policy after a call that overrode it: %d calls; want 5", dep.calls)
	}
	if _, err := guardrail.DoCall(context.Background(), p, guardrail.Call{MaxAttempts: -1}, dep.op); !errors.Is(err, guardrail.ErrInvalidConfig) {
		t.Errorf("Call.MaxAttempts -1: %v; want ErrInvalidConfig", err)
	}
}

func TestCallAttemptTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := unlimited()
		p.MaxAttempts = 1
		p.AttemptTimeout = 10 * time.Millisecond
		var bounded []bool
		op := func(ctx context.Context) (int, error) {
			_, ok := ctx.Deadline()
			bounded = append(bounded, ok)
			return 1, nil
		}
		_, _ = guardrail.Do(context.Background(), p, op)
		_, _ = guardrail.DoCall(context.Background(), p, guardrail.Call{AttemptTimeout: -1}, op)
		_, _ = guardrail.DoCall(context.Background(), p, guardrail.Call{AttemptTimeout: time.Hour}, op)
		if want := []bool{true, false, true}; len(bounded) != 3 || bounded[0] != want[0] || bounded[1] != want[1] || bounded[2] != want[2] {
			t.Errorf("attempt bounded: %v; want %v (policy's, none, the call's)", bounded, want)
		}
	})
}

func TestCallNoThrottleAndObserver(t *testing.T) {
	th, err := throttle.New(throttle.Config{})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	p := unlimited()
	p.Throttler = th
	ok := func(context.Context) (int, error) { return 1, nil }
	_, _ = guardrail.DoCall(context.Background(), p, guardrail.Call{NoThrottle: true, Observer: rec}, ok)
	if r, _ := th.Counts(); r != 0 {
		t.Errorf("Call.NoThrottle: the throttle counted %d requests; want 0", r)
	}
	if rec.count(event.CallEnd) != 1 {
		t.Errorf("Call.Observer saw %d call ends; want 1", rec.count(event.CallEnd))
	}
	_, _ = guardrail.Do(context.Background(), p, ok)
	if r, _ := th.Counts(); r != 1 {
		t.Errorf("the Policy's throttle after a call that turned it off: %d requests; want 1", r)
	}
}

// TestDoReturnsTheErrorUnmarked: the verdict a mark carries is for Do; the
// caller gets op's error itself, whether Do gives up with it or wraps it.
func TestDoReturnsTheErrorUnmarked(t *testing.T) {
	p := unlimited()
	p.MaxAttempts = 1
	dep := &counter{errs: []error{guardrail.Permanent(errBoom)}}
	if _, err := guardrail.Do(context.Background(), p, dep.op); err != errBoom {
		t.Errorf("Permanent(errBoom): Do returned %#v; want errBoom itself", err)
	}
	p2 := unlimited()
	p2.Budget = newBudget(budget.Config{Ratio: 0.01, Max: 1})
	dep = &counter{errs: []error{guardrail.Transient(errBoom)}}
	_, err := guardrail.Do(context.Background(), p2, dep.op)
	var ge *guardrail.Error
	if !errors.As(err, &ge) || ge.Err != errBoom {
		t.Errorf("budget exhausted: %v; want an *Error wrapping errBoom itself", err)
	}
}

// TestDiscardOnRetry: what a failed attempt holds is handed to Discard
// when, and only when, the call retries it; the last failure goes to the
// caller untouched.
func TestDiscardOnRetry(t *testing.T) {
	p := unlimited()
	var discarded []any
	dep := &counter{errs: []error{guardrail.Transient(errBoom)}}
	_, err := guardrail.DoCall(context.Background(), p, guardrail.Call{Discard: func(v any) { discarded = append(discarded, v) }}, dep.op)
	if dep.calls != 3 || len(discarded) != 2 {
		t.Fatalf("3 failed attempts: %d discarded; want the 2 that were retried", len(discarded))
	}
	if discarded[0] != errBoom || err != errBoom {
		t.Errorf("discarded %v, returned %v; want errBoom for both", discarded[0], err)
	}
}

// TestHoldKeepsTheSlotPastOp: with Hold, the slot of the attempt whose
// result the call returns stays taken after Do returned, until the holder
// releases it; slots of retried attempts are freed by Do.
func TestHoldKeepsTheSlotPastOp(t *testing.T) {
	bh, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 1})
	if err != nil {
		t.Fatal(err)
	}
	p := unlimited()
	var held *bulkhead.Slot
	var result any
	c := guardrail.Call{Bulkhead: bh, Hold: func(r any, s *bulkhead.Slot) { result, held = r, s }}
	dep := &counter{errs: []error{guardrail.Transient(errBoom), nil}}
	v, err := guardrail.DoCall(context.Background(), p, c, dep.op)
	if err != nil || dep.calls != 2 {
		t.Fatalf("DoCall: %v, %v after %d calls; want success on the second", v, err, dep.calls)
	}
	if held == nil || result != any(v) {
		t.Fatalf("Hold got %v, %v; want the returned value and a slot", result, held)
	}
	if bh.InFlight() != 1 {
		t.Errorf("in flight after Do returned: %d; want 1, held", bh.InFlight())
	}
	held.Release()
	if bh.InFlight() != 0 {
		t.Errorf("in flight after the holder released: %d; want 0", bh.InFlight())
	}
	// A failure the call returns is held too, with its error.
	held = nil
	p.MaxAttempts = 1
	dep = &counter{errs: []error{errBoom}}
	_, _ = guardrail.DoCall(context.Background(), p, c, dep.op)
	if held == nil || result != errBoom || bh.InFlight() != 1 {
		t.Errorf("a failure returned: held %v with %v, %d in flight; want errBoom's slot held", held, result, bh.InFlight())
	}
	held.Release()
}

// TestLostAnswerOutcome: a connection lost under a request ends a call
// that is not idempotent with ErrOutcomeUnknown, and a call made
// IdempotentWithKey is retried, then ends with ErrOutcomeUnknown around
// what ended it; an idempotent read just fails.
func TestLostAnswerOutcome(t *testing.T) {
	reset := syscall.ECONNRESET
	for _, tc := range []struct {
		name    string
		idem    guardrail.Idempotence
		calls   int
		unknown bool
	}{
		{"not idempotent", guardrail.NotIdempotent, 1, true},
		{"with key", guardrail.IdempotentWithKey, 3, true},
		{"idempotent", guardrail.Idempotent, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dep := &counter{errs: []error{reset}}
			_, err := guardrail.DoCall(context.Background(), unlimited(), guardrail.Call{Idempotent: tc.idem}, dep.op)
			if dep.calls != tc.calls || errors.Is(err, guardrail.ErrOutcomeUnknown) != tc.unknown || !errors.Is(err, reset) {
				t.Errorf("%d calls, %v; want %d calls, ErrOutcomeUnknown %v, around the reset", dep.calls, err, tc.calls, tc.unknown)
			}
		})
	}
}

// TestHoldHedgedWinner: in a hedged call, the slot Hold gets is the
// winner's; the loser's is freed by Do once the loser returns.
func TestHoldHedgedWinner(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bh, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 2})
		if err != nil {
			t.Fatal(err)
		}
		p := unlimited()
		p.Hedge = &guardrail.HedgeConfig{Delay: 10 * time.Millisecond}
		var held *bulkhead.Slot
		var calls atomic.Int32
		op := func(ctx context.Context) (int, error) {
			if calls.Add(1) == 1 {
				<-ctx.Done() // the first attempt stalls until the hedge wins
				return 0, ctx.Err()
			}
			return 2, nil
		}
		c := guardrail.Call{Bulkhead: bh, Hold: func(_ any, s *bulkhead.Slot) { held = s }}
		v, err := guardrail.DoHedged(context.Background(), p, c, op)
		if err != nil || v != 2 {
			t.Fatalf("DoHedged: %v, %v; want the hedge's 2", v, err)
		}
		synctest.Wait()
		if held == nil || bh.InFlight() != 1 {
			t.Fatalf("after the call: held %v, %d in flight; want the winner's slot held, the loser's freed", held, bh.InFlight())
		}
		held.Release()
		if bh.InFlight() != 0 {
			t.Errorf("after release: %d in flight; want 0", bh.InFlight())
		}
	})
}

// TestNegativeMaxRetryAfterIsNoLimit: a negative MaxRetryAfter turns the
// cap off, as a negative limit does everywhere: a one-minute Retry-After
// is waited for, when the deadline leaves room for it.
func TestNegativeMaxRetryAfterIsNoLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := unlimited()
		p.MaxRetryAfter = -1
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		dep := &counter{errs: []error{guardrail.RetryAfterError(errBoom, time.Minute), nil}}
		start := time.Now()
		if _, err := guardrail.Do(ctx, p, dep.op); err != nil || dep.calls != 2 {
			t.Fatalf("Do: %v after %d calls; want success on the second", err, dep.calls)
		}
		if waited := time.Since(start); waited != time.Minute {
			t.Errorf("waited %v; want the minute the server asked for", waited)
		}
	})
}

// TestRetryValidateNamesEveryField: Validate names each invalid field the
// way its owner does, and Is ErrInvalidConfig.
func TestRetryValidateNamesEveryField(t *testing.T) {
	err := guardrail.Retry{MaxAttempts: -1, AttemptTimeout: -1}.Validate("svc: Config")
	if !errors.Is(err, guardrail.ErrInvalidConfig) {
		t.Fatalf("Validate: %v; want ErrInvalidConfig", err)
	}
	for _, want := range []string{"svc: Config.MaxAttempts is -1;", "svc: Config.AttemptTimeout is -1ns;"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Validate: %q does not say %q", err, want)
		}
	}
	if err := (guardrail.Retry{}).Validate("svc: Config"); err != nil {
		t.Errorf("the zero Retry: %v; want valid", err)
	}
}
