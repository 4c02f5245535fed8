package bench

import (
	"context"
	"testing"
	"time"

	cenkalti "github.com/cenkalti/backoff/v5"
	"github.com/eapache/go-resiliency/retrier"
	"github.com/failsafe-go/failsafe-go"
	fsbudget "github.com/failsafe-go/failsafe-go/budget"
	"github.com/failsafe-go/failsafe-go/retrypolicy"
	"github.com/failsafe-go/failsafe-go/timeout"
	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
)

// The retry policies are configured alike where the libraries allow: 3
// attempts (the first call and 2 retries), exponential backoff from 100 ms
// capped at 10 s, with jitter. On the success path the backoff is never
// computed, so its shape does not matter; the number of attempts does not
// either, but it is the same everywhere.
const (
	maxAttempts = 3
	backoffBase = 100 * time.Millisecond
	backoffCap  = 10 * time.Second
)

func okCtx(context.Context) (int, error) { return 1, nil }

func okCtxErr(context.Context) error { return nil }

func newFailsafeRetry(withBudget bool) retrypolicy.RetryPolicy[int] {
	rb := retrypolicy.NewBuilder[int]().
		WithMaxAttempts(maxAttempts).
		WithBackoff(backoffBase, backoffCap).
		WithJitterFactor(0.5)
	if withBudget {
		// failsafe-go's budget bounds the retries in flight to a share of
		// the executions in flight (Envoy's retry budget), where
		// guardrail's is a token bucket over calls made (gRPC's retry
		// throttling): both cap retry traffic at about 10 %.
		rb = rb.WithBudget(fsbudget.NewBuilder().WithMaxRate(0.1).Build())
	}
	return rb.Build()
}

// BenchmarkRetry is a retrying call whose first attempt succeeds: what the
// retry machinery costs when nothing goes wrong.
func BenchmarkRetry(b *testing.B) {
	ctx := context.Background()
	b.Run("impl=direct", func(b *testing.B) {
		// The operation called directly: the floor.
		loop(b, func() { sinkInt, sinkErr = okCtx(ctx) })
	})
	b.Run("impl=guardrail-do", func(b *testing.B) {
		// Retry with guardrail's default retry budget (the budget is part
		// of every retry policy; the peers here have none). The breaker is
		// switched off: it has rows of its own below.
		p := &guardrail.Policy{
			Retry: guardrail.Retry{
				MaxAttempts: maxAttempts,
			},
			Breaker: must(breaker.New(breaker.Config{Mode: breaker.Disabled})),
		}
		loop(b, func() { sinkInt, sinkErr = guardrail.Do(ctx, p, okCtx) })
	})
	b.Run("impl=failsafe-executor", func(b *testing.B) {
		ex := failsafe.With[int](newFailsafeRetry(false))
		loop(b, func() { sinkInt, sinkErr = ex.Get(okInt) })
	})
	b.Run("impl=cenkalti-retry", func(b *testing.B) {
		// An ExponentialBackOff holds the state of one call's retries, so
		// each call needs its own.
		loop(b, func() {
			bo := cenkalti.NewExponentialBackOff()
			bo.InitialInterval, bo.MaxInterval = backoffBase, backoffCap
			sinkInt, sinkErr = cenkalti.Retry(ctx, okInt,
				cenkalti.WithBackOff(bo), cenkalti.WithMaxTries(maxAttempts))
		})
	})
	b.Run("impl=eapache-retrier", func(b *testing.B) {
		r := retrier.New(retrier.LimitedExponentialBackoff(maxAttempts-1, backoffBase, backoffCap), nil)
		r.SetJitter(0.5)
		loop(b, func() { sinkErr = r.RunCtx(ctx, okCtxErr) })
	})
}

// BenchmarkComposed is the whole policy of one call, whose first attempt
// succeeds: retry + retry budget + circuit breaker, without (timeout=none)
// and with (timeout=1s) a timeout per attempt.
func BenchmarkComposed(b *testing.B) {
	ctx := context.Background()
	b.Run("timeout=none/impl=guardrail-do", func(b *testing.B) {
		// The zero Policy is exactly this: 3 attempts, a 10 % budget, a
		// breaker with the window of BenchmarkBreaker.
		p := &guardrail.Policy{}
		modes(b, func() { sinkInt, sinkErr = guardrail.Do(ctx, p, okCtx) })
	})
	b.Run("timeout=none/impl=failsafe-retry-cb", func(b *testing.B) {
		ex := failsafe.With[int](newFailsafeRetry(false), newFailsafe(30*time.Second))
		modes(b, func() { sinkInt, sinkErr = ex.Get(okInt) })
	})
	b.Run("timeout=none/impl=failsafe-retry-budget-cb", func(b *testing.B) {
		ex := failsafe.With[int](newFailsafeRetry(true), newFailsafe(30*time.Second))
		modes(b, func() { sinkInt, sinkErr = ex.Get(okInt) })
	})

	const attemptTimeout = time.Second
	b.Run("timeout=1s/impl=baseline-withtimeout", func(b *testing.B) {
		// What an attempt timeout costs written by hand, with nothing else.
		modes(b, func() {
			actx, cancel := context.WithTimeout(ctx, attemptTimeout)
			sinkInt, sinkErr = okCtx(actx)
			cancel()
		})
	})
	b.Run("timeout=1s/impl=guardrail-do", func(b *testing.B) {
		p := &guardrail.Policy{Retry: guardrail.Retry{AttemptTimeout: attemptTimeout}}
		modes(b, func() { sinkInt, sinkErr = guardrail.Do(ctx, p, okCtx) })
	})
	b.Run("timeout=1s/impl=guardrail-do-parent-sooner", func(b *testing.B) {
		// The caller's deadline (1 min away) comes before the attempt
		// timeout (1 h): Do needs no timer, only a context it can cancel.
		p := &guardrail.Policy{Retry: guardrail.Retry{AttemptTimeout: time.Hour}}
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		modes(b, func() { sinkInt, sinkErr = guardrail.Do(pctx, p, okCtx) })
	})
	// failsafe-go: the timeout innermost, so it bounds each attempt; the
	// operation reads the attempt's context from its Execution, as it must
	// to be cancelled on timeout.
	fsOp := func(e failsafe.Execution[int]) (int, error) { return okCtx(e.Context()) }
	b.Run("timeout=1s/impl=failsafe-retry-cb-timeout", func(b *testing.B) {
		ex := failsafe.With[int](newFailsafeRetry(false), newFailsafe(30*time.Second), timeout.New[int](attemptTimeout))
		modes(b, func() { sinkInt, sinkErr = ex.GetWithExecution(fsOp) })
	})
	b.Run("timeout=1s/impl=failsafe-retry-budget-cb-timeout", func(b *testing.B) {
		ex := failsafe.With[int](newFailsafeRetry(true), newFailsafe(30*time.Second), timeout.New[int](attemptTimeout))
		modes(b, func() { sinkInt, sinkErr = ex.GetWithExecution(fsOp) })
	})
}

// BenchmarkClock is the price of one clock read on this machine, for
// reading the other tables: every breaker with a time window needs one.
func BenchmarkClock(b *testing.B) {
	b.Run("impl=time-now", func(b *testing.B) { loop(b, func() { sinkTime = time.Now() }) })
}
