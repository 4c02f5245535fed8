package guardrail_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/bulkhead"
)

func okOp(context.Context) (int, error) { return 1, nil }

// BenchmarkDo is the success path with the default policy and a context
// without a deadline: no clock read, no allocation.
func BenchmarkDo(b *testing.B) {
	p := &guardrail.Policy{}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
}

// BenchmarkDoDeadline: the caller's context has a deadline, so Do reads the
// clock once to check MinAttemptTime.
func BenchmarkDoDeadline(b *testing.B) {
	p := &guardrail.Policy{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
}

// BenchmarkWithTimeoutBaseline is what a hand-written attempt timeout costs:
// the baseline for BenchmarkDoAttemptTimeout.
func BenchmarkWithTimeoutBaseline(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, _ = okOp(actx)
		cancel()
	}
}

func BenchmarkDoAttemptTimeout(b *testing.B) {
	p := &guardrail.Policy{AttemptTimeout: time.Second}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
}

// BenchmarkDoAttemptTimeoutParentSooner: the caller's deadline is sooner
// than the attempt timeout, so no timer is needed.
func BenchmarkDoAttemptTimeoutParentSooner(b *testing.B) {
	p := &guardrail.Policy{AttemptTimeout: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
}

func BenchmarkDoParallel(b *testing.B) {
	p := &guardrail.Policy{}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			_, _ = guardrail.Do(ctx, p, okOp)
		}
	})
}

func BenchmarkTimeNow(b *testing.B) {
	var t time.Time
	for b.Loop() {
		t = time.Now()
	}
	_ = t
}

// BenchmarkDoNoBreaker is BenchmarkDo without the default breaker: the
// breaker's share of the success path is the difference.
func BenchmarkDoNoBreaker(b *testing.B) {
	p := &guardrail.Policy{Breaker: newBreaker(breaker.Config{Mode: breaker.Disabled})}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
}

// BenchmarkDoBulkhead adds a bulkhead to the default policy.
func BenchmarkDoBulkhead(b *testing.B) {
	p := &guardrail.Policy{Bulkhead: newBulkhead(bulkhead.Config{MaxConcurrent: 64})}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
}

// BenchmarkDoObserved attaches an observer that does nothing: the cost of
// building and delivering the events.
func BenchmarkDoObserved(b *testing.B) {
	p := &guardrail.Policy{Observer: event.ObserverFunc(func(ctx context.Context, _ event.Event) context.Context { return ctx })}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
}

var errBench = errors.New("bench: refused")

func permanentOp(context.Context) (int, error) { return 0, guardrail.Permanent(errBench) }

// BenchmarkDoPermanentError is the failure path that makes one attempt: the
// operation fails with an error that is not retried.
func BenchmarkDoPermanentError(b *testing.B) {
	p := &guardrail.Policy{}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, permanentOp)
	}
}

// BenchmarkDoCircuitOpen is the failure path that makes no attempt: the
// breaker is open and Do rejects the call.
func BenchmarkDoCircuitOpen(b *testing.B) {
	br := newBreaker(breaker.Config{})
	br.ForceOpen()
	p := &guardrail.Policy{Breaker: br}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
}

var errTransient = errors.New("bench: connection reset")

func transientOp(context.Context) (int, error) { return 0, errTransient }

func trivialClassify(error) guardrail.Verdict {
	return guardrail.Verdict{Outcome: breaker.Failure, Retryable: true}
}

// BenchmarkDoFailedAttempt is one call whose only attempt fails with a
// plain transient error, with the breaker disabled: what a failed attempt
// costs during an outage. classify=default asks DefaultClassify,
// classify=trivial a classifier that looks at nothing: the baseline.
func BenchmarkDoFailedAttempt(b *testing.B) {
	for _, tc := range []struct {
		name string
		c    guardrail.Classifier
	}{{"default", nil}, {"trivial", trivialClassify}} {
		b.Run("classify="+tc.name, func(b *testing.B) {
			p := &guardrail.Policy{MaxAttempts: 1, Classify: tc.c,
				Breaker: newBreaker(breaker.Config{Mode: breaker.Disabled})}
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				_, _ = guardrail.Do(ctx, p, transientOp)
			}
		})
	}
}
