package guardrail_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/event"
)

var errBusy = errors.New("same key in flight")

func inFlight(d time.Duration) error {
	// Outcome Failure on purpose: the engine must ignore it anyway.
	return guardrail.WithVerdict(errBusy, guardrail.Verdict{Outcome: breaker.Failure, InFlight: true, RetryAfter: d})
}

// An in-flight answer is retried after its delay, never sooner, for an
// idempotent call, and the breaker does not hold it against the
// dependency; for a call that is not idempotent it is final.
func TestInFlightRetriedAfterItsDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		br, err := breaker.New(breaker.Config{ConsecutiveFailures: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, tt := range []struct {
			name       string
			idempotent guardrail.Idempotence
			wantCalls  int
			wantWait   time.Duration
		}{
			{"keyed", guardrail.IdempotentWithKey, 3, 3 * time.Second},
			{"not idempotent", guardrail.NotIdempotent, 1, 0},
		} {
			p := &guardrail.Policy{Retry: guardrail.Retry{MaxAttempts: 3, Budget: budget.Unlimited()}}
			calls := 0
			start := time.Now()
			_, err := guardrail.DoCall(context.Background(), p, guardrail.Call{Idempotent: tt.idempotent, Breaker: br}, func(context.Context) (int, error) {
				calls++
				if calls < 3 {
					return 0, inFlight(1500 * time.Millisecond)
				}
				return 1, nil
			})
			if calls != tt.wantCalls || time.Since(start) != tt.wantWait {
				t.Errorf("%s: %d calls in %v (err %v), want %d in %v", tt.name, calls, time.Since(start), err, tt.wantCalls, tt.wantWait)
			}
			if st := br.State(); st != breaker.Closed {
				t.Errorf("%s: breaker %v after in-flight answers, want closed", tt.name, st)
			}
		}
	})
}

// The in-flight wait stays inside MaxRetryAfter, the deadline and the
// budget.
func TestInFlightBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		empty, err := budget.New(budget.Config{Max: 1})
		if err != nil {
			t.Fatal(err)
		}
		if !empty.TryRetry() {
			t.Fatal("a new budget has no token")
		}
		for _, tt := range []struct {
			name    string
			retry   guardrail.Retry
			timeout time.Duration
			want    error // nil: the attempt's own error
		}{
			{"max retry after", guardrail.Retry{MaxRetryAfter: time.Second, Budget: budget.Unlimited()}, time.Minute, errBusy},
			{"deadline", guardrail.Retry{Budget: budget.Unlimited()}, 2 * time.Second, guardrail.ErrDeadline},
			{"budget", guardrail.Retry{Budget: empty}, time.Minute, guardrail.ErrBudgetExhausted},
		} {
			ctx, cancel := context.WithTimeout(context.Background(), tt.timeout)
			calls := 0
			p := &guardrail.Policy{Idempotent: true, Retry: tt.retry}
			_, err := guardrail.Do(ctx, p, func(context.Context) (int, error) {
				calls++
				return 0, inFlight(5 * time.Second)
			})
			cancel()
			if calls != 1 || !errors.Is(err, tt.want) {
				t.Errorf("%s: %d calls, err %v; want 1 call, %v", tt.name, calls, err, tt.want)
			}
		}
	})
}

// kinds counts events by kind.
type kinds map[event.Kind]int

func (c kinds) Observe(ctx context.Context, e event.Event) context.Context {
	c[e.Kind]++
	return ctx
}

// Sends a transport made on its own are attempts: they count toward
// MaxAttempts, spend retry tokens and are reported.
func TestResendsCountAsAttempts(t *testing.T) {
	b, err := budget.New(budget.Config{Max: 10})
	if err != nil {
		t.Fatal(err)
	}
	obs := kinds{}
	p := &guardrail.Policy{Idempotent: true, Observer: obs, Retry: guardrail.Retry{MaxAttempts: 3, Budget: b}}
	resends, calls := 0, 0
	_, err = guardrail.DoCall(context.Background(), p, guardrail.Call{Resends: &resends}, func(context.Context) (int, error) {
		calls++
		resends++ // the transport sent it twice
		return 0, guardrail.Transient(errBusy)
	})
	var ge *guardrail.Error
	if errors.As(err, &ge) {
		t.Fatalf("err = %v, want the attempt's own", err)
	}
	// Call 1: 2 sends; call 2: 2 more, 4 >= 3: no third call.
	if calls != 2 {
		t.Errorf("op ran %d times, want 2: its resends used up MaxAttempts", calls)
	}
	if obs[event.AttemptStart] != 4 || obs[event.AttemptEnd] != 4 {
		t.Errorf("attempts started %d, ended %d; want 4 each", obs[event.AttemptStart], obs[event.AttemptEnd])
	}
	if got := b.Tokens(); got < 6.99 || got > 7.01 {
		t.Errorf("budget has %.2f tokens, want 7 (3 sends after the first)", got)
	}
	if resends != 0 {
		t.Errorf("Resends left at %d, want 0", resends)
	}
}
