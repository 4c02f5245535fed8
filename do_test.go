package guardrail_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/event"

	"go.uber.org/goleak"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var errBoom = errors.New("boom")

// counter is a fake dependency: it fails with errs[i] on call i (the last
// entry repeats; nil means success) and counts the calls it saw.
type counter struct {
	mu    sync.Mutex
	calls int
	errs  []error
	at    []time.Duration // time of each call since start
	start time.Time
}

func (c *counter) op(ctx context.Context) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.start.IsZero() {
		c.start = time.Now()
	}
	c.at = append(c.at, time.Since(c.start))
	i := min(c.calls, len(c.errs)-1)
	c.calls++
	if i < 0 || c.errs[i] == nil {
		return c.calls, nil
	}
	return 0, c.errs[i]
}

func unlimited() *guardrail.Policy {
	return &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{Budget: budget.Unlimited(), Backoff: backoff.None()}, Breaker: noBreaker()}
}

func noBreaker() *breaker.Breaker { return newBreaker(breaker.Config{Mode: breaker.Disabled}) }

// newBreaker, newBulkhead and newBudget are the constructors for
// configurations the test knows are valid.
func newBreaker(cfg breaker.Config) *breaker.Breaker     { return must(breaker.New(cfg)) }
func newBulkhead(cfg bulkhead.Config) *bulkhead.Bulkhead { return must(bulkhead.New(cfg)) }
func newBudget(cfg budget.Config) *budget.Budget         { return must(budget.New(cfg)) }

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestRetriesOnlyTransientFailures(t *testing.T) {
	tests := []struct {
		name      string
		err       error
		wantCalls int
	}{
		{"transient", guardrail.Transient(errBoom), 3},
		{"plain error", errBoom, 3},
		{"timeout", context.DeadlineExceeded, 3},
		{"connection refused", syscall.ECONNREFUSED, 3},
		{"permanent", guardrail.Permanent(errBoom), 1},
		{"verdict not retryable", guardrail.WithVerdict(errBoom, guardrail.Verdict{}), 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dep := &counter{errs: []error{tt.err}}
			_, err := guardrail.Do(context.Background(), unlimited(), dep.op)
			if !errors.Is(err, errors.Unwrap(tt.err)) && !errors.Is(err, tt.err) {
				t.Errorf("err = %v, want it to wrap %v", err, tt.err)
			}
			if dep.calls != tt.wantCalls {
				t.Errorf("dependency saw %d calls, want %d", dep.calls, tt.wantCalls)
			}
		})
	}
}

func TestCallerCancellationIsNotRetried(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	_, err := guardrail.Do(ctx, unlimited(), func(ctx context.Context) (int, error) {
		calls++
		cancel()
		return 0, ctx.Err()
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if calls != 1 {
		t.Fatalf("calls = %d, want 1: a cancelled caller is not retried", calls)
	}
}

func TestMaxAttemptsCountsTheFirstCall(t *testing.T) {
	for _, tt := range []struct{ max, want int }{{1, 1}, {2, 2}, {5, 5}, {0, guardrail.DefaultMaxAttempts}} {
		p := unlimited()
		p.MaxAttempts = tt.max
		dep := &counter{errs: []error{errBoom}}
		_, err := guardrail.Do(context.Background(), p, dep.op)
		if !errors.Is(err, errBoom) {
			t.Errorf("MaxAttempts %d: err = %v", tt.max, err)
		}
		if dep.calls != tt.want {
			t.Errorf("MaxAttempts %d: %d calls, want %d", tt.max, dep.calls, tt.want)
		}
	}
}

func TestSucceedsAfterTransientFailures(t *testing.T) {
	dep := &counter{errs: []error{errBoom, errBoom, nil}}
	got, err := guardrail.Do(context.Background(), unlimited(), dep.op)
	if err != nil || got != 3 || dep.calls != 3 {
		t.Fatalf("Do = %v, %v after %d calls; want the third call's 3, nil", got, err, dep.calls)
	}
}

func TestNotIdempotentRetriesOnlyUnsent(t *testing.T) {
	p := &guardrail.Policy{Retry: guardrail.Retry{Budget: budget.Unlimited(), Backoff: backoff.None()}} // Idempotent false
	dep := &counter{errs: []error{errBoom}}
	if _, err := guardrail.Do(context.Background(), p, dep.op); !errors.Is(err, errBoom) || dep.calls != 1 {
		t.Fatalf("plain failure of a non-idempotent op: %d calls (err %v), want 1", dep.calls, err)
	}
	dep = &counter{errs: []error{syscall.ECONNREFUSED, nil}}
	if _, err := guardrail.Do(context.Background(), p, dep.op); err != nil || dep.calls != 2 {
		t.Fatalf("refused connection of a non-idempotent op: %d calls (err %v), want a retry", dep.calls, err)
	}
}

func TestTimeoutOfNonIdempotentIsOutcomeUnknown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &guardrail.Policy{Retry: guardrail.Retry{AttemptTimeout: time.Second, Budget: budget.Unlimited()}}
		calls := 0
		_, err := guardrail.Do(context.Background(), p, func(ctx context.Context) (int, error) {
			calls++
			<-ctx.Done() // the server took the request and never answered
			return 0, ctx.Err()
		})
		if !errors.Is(err, guardrail.ErrOutcomeUnknown) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrOutcomeUnknown wrapping the timeout", err)
		}
		if calls != 1 {
			t.Fatalf("calls = %d: an unknown outcome must never be retried", calls)
		}
		var ge *guardrail.Error
		if !errors.As(err, &ge) || ge.Attempts != 1 {
			t.Fatalf("typed error = %+v, want Attempts 1", ge)
		}
	})
}

func TestAttemptTimeoutRetriesIdempotent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := unlimited()
		p.AttemptTimeout = 1200 * time.Millisecond
		start := time.Now()
		calls := 0
		_, err := guardrail.Do(context.Background(), p, func(ctx context.Context) (int, error) {
			calls++
			<-ctx.Done()
			return 0, ctx.Err()
		})
		if !errors.Is(err, context.DeadlineExceeded) || calls != 3 {
			t.Fatalf("err = %v after %d calls, want 3 timed-out attempts", err, calls)
		}
		if got := time.Since(start); got != 3600*time.Millisecond {
			t.Fatalf("took %v, want exactly 3 x 1.2s", got)
		}
	})
}

// A retry whose delay plus MinAttemptTime does not fit in the time left is not
// attempted, and Do does not sleep toward the deadline first.
func TestNoRetryThatCannotFitTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		p := unlimited()
		p.Backoff = backoff.Constant(800 * time.Millisecond)
		p.MinAttemptTime = 100 * time.Millisecond
		start := time.Now()
		calls := 0
		_, err := guardrail.Do(ctx, p, func(ctx context.Context) (int, error) {
			calls++
			time.Sleep(200 * time.Millisecond) // 800 left; 800 + 100 > 800
			return 0, errBoom
		})
		if !errors.Is(err, guardrail.ErrDeadline) || !errors.Is(err, errBoom) {
			t.Fatalf("err = %v, want ErrDeadline wrapping the last error", err)
		}
		if calls != 1 {
			t.Fatalf("calls = %d, want 1", calls)
		}
		if got := time.Since(start); got != 200*time.Millisecond {
			t.Fatalf("Do returned after %v, want at once after the 200ms attempt", got)
		}
	})
}

func TestMinAttemptTimeRefusesToStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		calls := 0
		_, err := guardrail.Do(ctx, nil, func(context.Context) (int, error) { calls++; return 1, nil })
		if !errors.Is(err, guardrail.ErrDeadline) || calls != 0 {
			t.Fatalf("30ms left, MinAttemptTime 50ms: err %v, %d calls; want ErrDeadline, 0 calls", err, calls)
		}
	})
}

func TestRetryAfterHonouredExactly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		dep := &counter{errs: []error{guardrail.RetryAfterError(errBoom, 1500*time.Millisecond), nil}}
		p := unlimited()
		p.Backoff = backoff.Constant(10 * time.Millisecond) // would be much sooner
		if _, err := guardrail.Do(context.Background(), p, dep.op); err != nil {
			t.Fatal(err)
		}
		if dep.calls != 2 || dep.at[1] != 1500*time.Millisecond {
			t.Fatalf("retry at %v, want exactly 1.5s after the first call", dep.at)
		}
	})
}

func TestRetryAfterBeyondCapOrDeadlineEndsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Longer than MaxRetryAfter: not retried, never sooner than asked.
		dep := &counter{errs: []error{guardrail.RetryAfterError(errBoom, time.Minute)}}
		start := time.Now()
		_, err := guardrail.Do(context.Background(), unlimited(), dep.op)
		if !errors.Is(err, errBoom) || dep.calls != 1 || time.Since(start) != 0 {
			t.Fatalf("Retry-After 1m over a 30s cap: %d calls, %v, err %v; want 1 call, at once", dep.calls, time.Since(start), err)
		}

		// Longer than the time left: ends at once with ErrDeadline and says when.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		dep = &counter{errs: []error{guardrail.RetryAfterError(errBoom, 5*time.Second)}}
		start = time.Now()
		_, err = guardrail.Do(ctx, unlimited(), dep.op)
		var ge *guardrail.Error
		if !errors.As(err, &ge) || ge.Kind != guardrail.ErrDeadline || ge.RetryIn != 5*time.Second {
			t.Fatalf("err = %v, want ErrDeadline with RetryIn 5s", err)
		}
		if dep.calls != 1 || time.Since(start) != 0 {
			t.Fatalf("%d calls after %v, want 1 call and no wait", dep.calls, time.Since(start))
		}

		// A smaller MaxRetryAfter is honoured too.
		p := unlimited()
		p.MaxRetryAfter = time.Second
		dep = &counter{errs: []error{guardrail.RetryAfterError(errBoom, 2*time.Second)}}
		if _, err := guardrail.Do(context.Background(), p, dep.op); !errors.Is(err, errBoom) || dep.calls != 1 {
			t.Fatalf("MaxRetryAfter 1s, asked 2s: %d calls, err %v", dep.calls, err)
		}
		// A negative MaxRetryAfter is no limit: an hour is waited for.
		p = unlimited()
		p.MaxRetryAfter = -1
		dep = &counter{errs: []error{guardrail.RetryAfterError(errBoom, time.Hour), nil}}
		if _, err := guardrail.Do(context.Background(), p, dep.op); err != nil || dep.at[1] != time.Hour {
			t.Fatalf("no limit: retry at %v, err %v; want after the hour asked", dep.at, err)
		}

		// With no limit, a Retry-After of the longest Duration over a
		// deadline ends at once too: the deadline check must not overflow.
		ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		dep = &counter{errs: []error{guardrail.RetryAfterError(errBoom, math.MaxInt64)}}
		start = time.Now()
		_, err = guardrail.Do(ctx, p, dep.op)
		if !errors.As(err, &ge) || ge.Kind != guardrail.ErrDeadline || dep.calls != 1 || time.Since(start) != 0 {
			t.Fatalf("Retry-After MaxInt64 with no limit: %d calls after %v, err %v; want 1 call, ErrDeadline at once", dep.calls, time.Since(start), err)
		}
	})
}

// 1000 calls to a dead dependency with 3 attempts each
// make 3000 attempts without a budget and about 1110 with a 10 % budget.
func TestBudgetCapsAmplification(t *testing.T) {
	run := func(b *budget.Budget) (attempts int, exhausted int) {
		p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{Budget: b, Backoff: backoff.None()}, Breaker: noBreaker()}
		dep := &counter{errs: []error{errBoom}}
		for range 1000 {
			_, err := guardrail.Do(context.Background(), p, dep.op)
			if errors.Is(err, guardrail.ErrBudgetExhausted) {
				exhausted++
			}
		}
		return dep.calls, exhausted
	}
	if got, _ := run(budget.Unlimited()); got != 3000 {
		t.Errorf("without a budget: %d attempts, want exactly 3000", got)
	}
	got, exhausted := run(nil) // the policy's own default budget
	if got < 1100 || got > 1112 {
		t.Errorf("with the default budget: %d attempts, want about 1110 (1.11 per call)", got)
	}
	if exhausted < 880 {
		t.Errorf("only %d calls ended with ErrBudgetExhausted", exhausted)
	}
}

func TestCancelDuringBackoffReturnsAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		p := unlimited()
		p.Backoff = backoff.Constant(10 * time.Second)
		go func() {
			time.Sleep(time.Second)
			cancel()
		}()
		start := time.Now()
		_, err := guardrail.Do(ctx, p, func(context.Context) (int, error) { return 0, errBoom })
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if got := time.Since(start); got > time.Second+time.Millisecond {
			t.Fatalf("returned %v after start, want within 1ms of the cancel at 1s", got)
		}
	})
}

func TestAttemptContextEndsWithTheAttempt(t *testing.T) {
	p := unlimited()
	p.AttemptTimeout = time.Minute
	var seen []context.Context
	_, _ = guardrail.Do(context.Background(), p, func(ctx context.Context) (int, error) {
		seen = append(seen, ctx)
		return 0, errBoom
	})
	for i, ctx := range seen {
		if ctx.Err() == nil {
			t.Errorf("attempt %d's context still live after the attempt", i+1)
		}
	}
	// Parent deadline sooner than AttemptTimeout: still cancelled at the end.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	var got context.Context
	_, _ = guardrail.Do(ctx, p, func(ctx context.Context) (int, error) { got = ctx; return 1, nil })
	if got.Err() == nil {
		t.Error("attempt context under a sooner parent deadline is still live")
	}
	if dl, _ := got.Deadline(); !dl.Equal(func() time.Time { d, _ := ctx.Deadline(); return d }()) {
		t.Error("attempt context lost the parent's deadline")
	}
}

func TestPanicIsRecordedAndPropagates(t *testing.T) {
	var events []event.Event
	p := unlimited()
	p.Observer = event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		events = append(events, e)
		return ctx
	})
	func() {
		defer func() {
			if r := recover(); r != "kaboom" {
				t.Fatalf("recovered %v, want the op's panic", r)
			}
		}()
		_, _ = guardrail.Do(context.Background(), p, func(context.Context) (int, error) { panic("kaboom") })
	}()
	if len(events) < 2 {
		t.Fatalf("events = %+v", events)
	}
	end, last := events[len(events)-2], events[len(events)-1]
	if end.Kind != event.AttemptEnd || end.Outcome != event.AttemptFailure {
		t.Fatalf("attempt end = %+v, want a failed attempt", end)
	}
	if last.Kind != event.CallEnd || last.Outcome != event.OutcomeError {
		t.Fatalf("last event = %+v, want the call's end, so observers close what they opened", last)
	}
}

// An invalid Policy is reported at first use, every invalid field by
// name, without running the operation, and the same error on every call.
func TestInvalidPolicyIsRejected(t *testing.T) {
	for _, tc := range []struct {
		p    *guardrail.Policy
		want string
	}{
		{&guardrail.Policy{Name: "a", Retry: guardrail.Retry{MaxAttempts: -1}},
			`guardrail: invalid config "a": Policy.MaxAttempts is -1; want 1 or more, or zero for the default`},
		{&guardrail.Policy{Name: "b", Retry: guardrail.Retry{AttemptTimeout: -time.Second}},
			`guardrail: invalid config "b": Policy.AttemptTimeout is -1s; want a positive duration, or zero for none`},
		{&guardrail.Policy{Name: "c", Retry: guardrail.Retry{MaxAttempts: -2, AttemptTimeout: -time.Millisecond}},
			`guardrail: invalid config "c": Policy.MaxAttempts is -2; want 1 or more, or zero for the default` + "\n" +
				`guardrail: invalid config "c": Policy.AttemptTimeout is -1ms; want a positive duration, or zero for none`},
	} {
		for range 2 {
			calls := 0
			_, err := guardrail.Do(context.Background(), tc.p, func(context.Context) (int, error) { calls++; return 0, nil })
			if !errors.Is(err, guardrail.ErrInvalidConfig) || calls != 0 || err.Error() != tc.want {
				t.Errorf("err %v, %d calls; want ErrInvalidConfig without running op:\n%s", err, calls, tc.want)
			}
		}
	}
	// The limits whose comments say negative means no limit are valid.
	p := &guardrail.Policy{Retry: guardrail.Retry{MinAttemptTime: -1, MaxRetryAfter: -1}}
	if _, err := guardrail.Do(context.Background(), p, okOp); err != nil {
		t.Fatalf("negative MinAttemptTime and MaxRetryAfter: %v", err)
	}
}

func TestNilPolicyUsesDefaults(t *testing.T) {
	calls := 0
	v, err := guardrail.Do(context.Background(), nil, func(context.Context) (string, error) {
		calls++
		if calls == 1 {
			return "", syscall.ECONNREFUSED // safe to retry even though not idempotent
		}
		return "ok", nil
	})
	if v != "ok" || err != nil || calls != 2 {
		t.Fatalf("Do(nil policy) = %q, %v after %d calls", v, err, calls)
	}
}

// The jitter Do draws is the policy's: a fixed draw of 0.5 makes full jitter
// wait exactly half the exponential window.
func TestBackoffUsesThePolicysDraws(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{Budget: budget.Unlimited(), MaxAttempts: 4}, Rand: func() float64 { return 0.5 }}
		dep := &counter{errs: []error{errBoom}}
		_, _ = guardrail.Do(context.Background(), p, dep.op)
		want := []time.Duration{0, 50 * time.Millisecond, 150 * time.Millisecond, 350 * time.Millisecond}
		if fmt.Sprint(dep.at) != fmt.Sprint(want) {
			t.Fatalf("attempts at %v, want %v", dep.at, want)
		}
	})
}

func TestObserverSeesTheWholeCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		type key struct{}
		var kinds []string
		p := unlimited()
		p.Name = "pricing"
		p.Backoff = backoff.Constant(100 * time.Millisecond)
		p.Observer = event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			if e.Dependency != "pricing" {
				t.Errorf("event %v without the dependency name", e.Kind)
			}
			s := e.Kind.String()
			switch e.Kind {
			case event.AttemptStart:
				s = fmt.Sprintf("%s#%d+%v", s, e.Attempt, e.Delay)
				ctx = context.WithValue(ctx, key{}, e.Attempt)
			case event.AttemptEnd:
				s = fmt.Sprintf("%s#%d:%s/%v", s, e.Attempt, e.Outcome, e.Duration)
			case event.Retry:
				s = fmt.Sprintf("%s:%s/%v", s, e.Reason, e.Delay)
			case event.CallEnd:
				s = fmt.Sprintf("%s:%s/%d/%v", s, e.Outcome, e.Attempt, e.Duration)
			}
			kinds = append(kinds, s)
			return ctx
		})
		calls := 0
		_, err := guardrail.Do(event.WithOperation(context.Background(), "get"), p, func(ctx context.Context) (int, error) {
			calls++
			if ctx.Value(key{}) != calls {
				t.Errorf("attempt %d: op did not get the observer's context", calls)
			}
			time.Sleep(10 * time.Millisecond)
			if calls < 2 {
				return 0, errBoom
			}
			return 1, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		want := "[call_start attempt_start#1+0s attempt_end#1:failure/10ms retry:backoff/100ms attempt_start#2+100ms attempt_end#2:success/10ms call_end:ok/2/120ms]"
		if got := fmt.Sprint(kinds); got != want {
			t.Fatalf("events\n got %s\nwant %s", got, want)
		}
	})
}

func TestObserversCombine(t *testing.T) {
	if event.Join() != nil || event.Join(nil, nil) != nil {
		t.Fatal("Observers of nothing must be nil, so it costs nothing")
	}
	var a, b int
	oa := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context { a++; return ctx })
	ob := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context { b++; return ctx })
	o := event.Join(oa, nil, event.Join(ob))
	o.Observe(context.Background(), event.Event{})
	if a != 1 || b != 1 {
		t.Fatalf("a=%d b=%d, want each called once", a, b)
	}
}

func TestErrorMessage(t *testing.T) {
	err := &guardrail.Error{Kind: guardrail.ErrDeadline, Attempts: 2, RetryIn: time.Second, Err: errBoom}
	if got, want := err.Error(), "guardrail: deadline too close for another attempt after 2 attempt(s) (retry in 1s): boom"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

func TestDoCallDecidesIdempotencyPerCall(t *testing.T) {
	p := &guardrail.Policy{Name: "api", Idempotent: false, Retry: guardrail.Retry{Budget: budget.Unlimited(), Backoff: backoff.None()}}
	var deps []string
	p.Observer = event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.CallStart {
			deps = append(deps, e.Dependency)
		}
		return ctx
	})
	dep := &counter{errs: []error{errBoom}}
	_, _ = guardrail.DoCall(context.Background(), p, guardrail.Call{Idempotent: guardrail.Idempotent, Dependency: "api.example:443"}, dep.op)
	if dep.calls != 3 {
		t.Fatalf("DoCall with Idempotent: %d calls, want 3", dep.calls)
	}
	_, _ = guardrail.Do(context.Background(), p, dep.op)
	if dep.calls != 4 {
		t.Fatalf("Do with a non-idempotent policy retried: %d calls, want 4", dep.calls)
	}
	_, _ = guardrail.DoCall(context.Background(), p, guardrail.Call{}, dep.op)
	if dep.calls != 5 {
		t.Fatalf("DoCall with the zero Call through a non-idempotent policy retried: %d calls, want 5", dep.calls)
	}
	if fmt.Sprint(deps) != "[api.example:443 api api]" {
		t.Fatalf("dependencies in events = %v", deps)
	}
}

func TestErrorTimeoutAndBudgetRetryIn(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &guardrail.Policy{Retry: guardrail.Retry{AttemptTimeout: time.Second}, Breaker: noBreaker()}
		_, err := guardrail.Do(context.Background(), p, func(ctx context.Context) (int, error) { <-ctx.Done(); return 0, ctx.Err() })
		var te interface{ Timeout() bool }
		if !errors.As(err, &te) || !te.Timeout() {
			t.Fatalf("ErrOutcomeUnknown from a timeout: Timeout() false (%v)", err)
		}
	})
	b := newBudget(budget.Config{Max: 1})
	b.TryRetry()
	p := &guardrail.Policy{Idempotent: true, Retry: guardrail.Retry{Budget: b, Backoff: backoff.Constant(300 * time.Millisecond)}, Breaker: noBreaker()}
	_, err := guardrail.Do(context.Background(), p, func(context.Context) (int, error) { return 0, errBoom })
	var ge *guardrail.Error
	if !errors.As(err, &ge) || ge.Kind != guardrail.ErrBudgetExhausted || ge.RetryIn != 300*time.Millisecond || ge.Timeout() {
		t.Fatalf("err = %#v, want ErrBudgetExhausted with RetryIn 300ms and no timeout", err)
	}
}

// The zero Call means "as the Policy says", for Idempotent as for every
// other field: DoCall with a Call that sets only the Dependency makes as
// many attempts as Do. When Call.Idempotent was a bool, its zero value
// overrode an idempotent Policy and the call made 1 attempt instead of 3.
func TestZeroCallIdempotenceFollowsThePolicy(t *testing.T) {
	for _, tc := range []struct {
		policy bool
		call   guardrail.Idempotence
		want   int
	}{
		{true, guardrail.IdempotenceOfPolicy, 3},
		{false, guardrail.IdempotenceOfPolicy, 1},
		{true, guardrail.NotIdempotent, 1},
		{false, guardrail.Idempotent, 3},
		{true, guardrail.Idempotent, 3},
		{false, guardrail.NotIdempotent, 1},
	} {
		p := unlimited()
		p.Idempotent = tc.policy
		viaDo, viaCall := &counter{errs: []error{errBoom}}, &counter{errs: []error{errBoom}}
		if tc.call == guardrail.IdempotenceOfPolicy {
			_, _ = guardrail.Do(context.Background(), p, viaDo.op)
			if viaDo.calls != tc.want {
				t.Errorf("Do, Policy.Idempotent %v: %d attempts, want %d", tc.policy, viaDo.calls, tc.want)
			}
		}
		_, _ = guardrail.DoCall(context.Background(), p, guardrail.Call{Dependency: "x", Idempotent: tc.call}, viaCall.op)
		if viaCall.calls != tc.want {
			t.Errorf("DoCall, Policy.Idempotent %v, Call.Idempotent %v: %d attempts, want %d", tc.policy, tc.call, viaCall.calls, tc.want)
		}
	}
}

// A call whose own context was cancelled ends as canceled, even when the
// cancel cause, or the error op returns, wraps another call's *Error (a
// fallback group stops the losing sibling with the winner's error). Read
// back from the error, such a call counted as circuit_open against a
// dependency whose breaker never opened.
func TestCancelledCallOutcomeIsCanceled(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var outcomes []string
		obs := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			if e.Kind == event.CallEnd {
				outcomes = append(outcomes, e.Outcome)
			}
			return ctx
		})
		sibling := &guardrail.Error{Kind: guardrail.ErrCircuitOpen, Err: breaker.ErrOpen}
		p := unlimited()
		p.Observer = obs

		// Cancelled during the attempt; op returns the cause.
		ctx, cancel := context.WithCancelCause(context.Background())
		_, err := guardrail.Do(ctx, p, func(ctx context.Context) (int, error) {
			cancel(sibling)
			return 0, context.Cause(ctx)
		})
		if !errors.Is(err, guardrail.ErrCircuitOpen) {
			t.Fatalf("err = %v, want op's error as is", err)
		}

		// Cancelled during the backoff before a retry.
		p2 := unlimited()
		p2.Observer, p2.Backoff = obs, backoff.Constant(time.Hour)
		ctx2, cancel2 := context.WithCancelCause(context.Background())
		_, _ = guardrail.Do(ctx2, p2, func(context.Context) (int, error) {
			time.AfterFunc(time.Millisecond, func() { cancel2(sibling) })
			return 0, errBoom
		})

		// A nested call's *Error, returned by op of a call nobody cancelled, is
		// that call's outcome, not this one's: this call failed with an error.
		_, _ = guardrail.Do(context.Background(), &guardrail.Policy{Retry: guardrail.Retry{MaxAttempts: 1}, Breaker: noBreaker(), Observer: obs},
			func(context.Context) (int, error) { return 0, guardrail.Permanent(sibling) })

		want := []string{event.OutcomeCanceled, event.OutcomeCanceled, event.OutcomeError}
		if !slices.Equal(outcomes, want) {
			t.Fatalf("CallEnd outcomes %v, want %v", outcomes, want)
		}
	})
}
