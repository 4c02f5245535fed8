package guardrail_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/event"
	"github.com/guardrail-go/guardrail/fleet"
)

var errPauseBusy = errors.New("503 busy")

// Two processes of a fleet, each with its own Policy and Hints on a shared
// bus: the first is answered "Retry-After: 2s" and retries after it; the
// second, meanwhile, refuses its calls locally without sending them, with
// ErrCircuitOpen around ErrPaused and RetryIn the rest of the pause, and
// sends again once the pause has ended.
func TestPausesHoldTheFleetBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		bus := new(fleet.MemoryBus)
		newPolicy := func() *guardrail.Policy {
			h, err := fleet.NewHints(fleet.HintsConfig{Bus: bus, Dependencies: []string{"pay"}})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { h.Close() })
			<-h.Subscribed()
			return &guardrail.Policy{Name: "pay", Idempotent: true, Retry: guardrail.Retry{Pauses: h}}
		}
		a, b := newPolicy(), newPolicy()
		var sent atomic.Int64
		busyUntil := time.Now().Add(2 * time.Second)
		op := func(context.Context) (int, error) {
			sent.Add(1)
			if time.Now().Before(busyUntil) {
				return 0, guardrail.RetryAfterError(errPauseBusy, 2*time.Second)
			}
			return 1, nil
		}
		done := make(chan error, 1)
		go func() {
			_, err := guardrail.Do(context.Background(), a, op)
			done <- err
		}()
		synctest.Wait() // a got its answer and waits to retry; b heard the hint
		if sent.Load() != 1 {
			t.Fatalf("%d sends, want 1", sent.Load())
		}
		var rejects []event.Event
		obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			if e.Kind == event.BreakerReject {
				rejects = append(rejects, e)
			}
			return ctx
		})
		time.Sleep(500 * time.Millisecond)
		_, err := guardrail.DoCall(context.Background(), b, guardrail.Call{Observer: obs}, op)
		var ge *guardrail.Error
		if !errors.Is(err, guardrail.ErrCircuitOpen) || !errors.Is(err, guardrail.ErrPaused) || !errors.As(err, &ge) {
			t.Fatalf("peer: err = %v, want ErrCircuitOpen around ErrPaused", err)
		}
		if ge.RetryIn != 1500*time.Millisecond || ge.Attempts != 0 {
			t.Fatalf("peer: RetryIn %v after %d attempts, want 1.5s after 0", ge.RetryIn, ge.Attempts)
		}
		if len(rejects) != 1 || rejects[0].Reason != event.ReasonPaused || rejects[0].Delay != 1500*time.Millisecond {
			t.Fatalf("events %+v, want one BreakerReject with ReasonPaused", rejects)
		}
		if sent.Load() != 1 {
			t.Fatalf("%d sends: the paused peer sent", sent.Load())
		}
		if err := <-done; err != nil {
			t.Fatalf("the call that was asked to wait: %v, want its retry to succeed", err)
		}
		if sent.Load() != 2 || !time.Now().Equal(busyUntil) {
			t.Fatalf("%d sends, retried at %v: want the retry exactly when the pause ends", sent.Load(), time.Now())
		}
		if v, err := guardrail.Do(context.Background(), b, op); err != nil || v != 1 {
			t.Fatalf("peer after the pause: %v, %v", v, err)
		}
	})
}

// A retry whose backoff ends before a pause a peer announced waits for
// the pause; one that the pause would push past MaxRetryAfter is refused.
func TestRetriesWaitForAPause(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h, err := fleet.NewHints(fleet.HintsConfig{Dependencies: []string{"pay"}})
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		p := &guardrail.Policy{Name: "pay", Idempotent: true, Retry: guardrail.Retry{Pauses: h, MaxRetryAfter: 5 * time.Second}}
		start := time.Now()
		var sends []time.Duration
		_, err = guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
			sends = append(sends, time.Since(start))
			if len(sends) == 1 {
				// Another call of this process is told to wait meanwhile.
				h.RetryAfter("pay", 3*time.Second, time.Now())
				return 0, errPauseBusy
			}
			return 1, nil
		})
		if err != nil || len(sends) != 2 || sends[1] != 3*time.Second {
			t.Fatalf("err %v, sends at %v: want the retry at 3s", err, sends)
		}
		h.RetryAfter("pay", 10*time.Second, time.Now()) // past MaxRetryAfter
		_, err = guardrail.Do(context.Background(), p, func(context.Context) (int, error) { return 0, errPauseBusy })
		if !errors.Is(err, guardrail.ErrCircuitOpen) {
			t.Fatalf("err = %v: the pause refuses the call", err)
		}
	})
}

// A Retry-After that the call does not retry (attempts spent, or longer
// than MaxRetryAfter) still pauses the process's other calls; an in-flight
// answer's, which is about one key, does not.
func TestRetryAfterIsSharedWhenNotRetried(t *testing.T) {
	h, err := fleet.NewHints(fleet.HintsConfig{Dependencies: []string{"pay"}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p := &guardrail.Policy{Name: "pay", Idempotent: true, Retry: guardrail.Retry{Pauses: h, MaxAttempts: 1}}
	_, err = guardrail.Do(context.Background(), p, func(context.Context) (int, error) {
		return 0, guardrail.RetryAfterError(errPauseBusy, time.Minute)
	})
	if !errors.Is(err, errPauseBusy) {
		t.Fatalf("err = %v", err)
	}
	until, ok := h.Paused("pay", time.Now())
	if !ok || time.Until(until) > fleet.DefaultMaxPause {
		t.Fatalf("Paused = %v, %v: want paused, for at most MaxPause", until, ok)
	}
}

// With Pauses set the success path still allocates nothing.
func TestPausesSuccessPathDoesNotAllocate(t *testing.T) {
	h, err := fleet.NewHints(fleet.HintsConfig{Dependencies: []string{"pay"}})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	p := &guardrail.Policy{Name: "pay", Retry: guardrail.Retry{Pauses: h}}
	ctx := context.Background()
	guardrail.Do(ctx, p, okOp)
	if n := testing.AllocsPerRun(200, func() { guardrail.Do(ctx, p, okOp) }); n != 0 {
		t.Fatalf("Do with Pauses allocates %v times per call", n)
	}
}
