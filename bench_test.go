package guardrail_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/guardrail-go/guardrail/event"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/bulkhead"
)

func okOp(context.Context) (int, error) { return 1, nil }

// cpuClock measures the CPU time of a benchmark's loop, reported as
// cpu-ns/op beside ns/op: on a shared machine the wall clock also counts
// the time other processes held the cores, CPU time does not. Under
// RunParallel it adds up the CPU time of every core.
type cpuClock time.Duration

func startCPU() cpuClock { return cpuClock(cpuTime()) }

func (c cpuClock) report(b *testing.B) {
	if now := cpuTime(); c >= 0 && now >= 0 && b.N > 0 {
		b.ReportMetric(float64(now-time.Duration(c))/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkDo is the success path with the default policy and a context
// without a deadline: no clock read, no allocation.
func BenchmarkDo(b *testing.B) {
	p := &guardrail.Policy{}
	ctx := context.Background()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
	cpu.report(b)
}

// BenchmarkDoDeadline: the caller's context has a deadline, so Do reads the
// clock to check MinAttemptTime. An hour is too far away to bound the
// attempt, so the breaker reads the attempt's end too.
func BenchmarkDoDeadline(b *testing.B) {
	p := &guardrail.Policy{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
	cpu.report(b)
}

// nearDeadline is the deadline of the benchmarks of calls whose deadline
// bounds their attempts to less than one bucket of the breaker's window
// (1 s by default), the usual case of a call to another service.
const nearDeadline = 800 * time.Millisecond

// nearDeadlines returns a context whose deadline is at most nearDeadline
// away and about that much for each call, renewed every 256 calls (so that
// the renewal's cost is noise), and the function that ends the last one.
func nearDeadlines() (next func() context.Context, stop func()) {
	var ctx context.Context
	var cancel context.CancelFunc = func() {}
	n := 0
	next = func() context.Context {
		if n%256 == 0 {
			cancel()
			ctx, cancel = context.WithTimeout(context.Background(), nearDeadline)
		}
		n++
		return ctx
	}
	return next, func() { cancel() }
}

// BenchmarkDoNearDeadline is BenchmarkDoDeadline with a deadline 800 ms
// away: one clock read in all.
func BenchmarkDoNearDeadline(b *testing.B) {
	p := &guardrail.Policy{}
	next, stop := nearDeadlines()
	defer stop()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(next(), p, okOp)
	}
	cpu.report(b)
}

// BenchmarkDoDeadlineAttemptTimeout: a far deadline and an attempt timeout
// that comes first, so the attempt has a timer of its own.
func BenchmarkDoDeadlineAttemptTimeout(b *testing.B) {
	p := &guardrail.Policy{Retry: guardrail.Retry{AttemptTimeout: 500 * time.Millisecond}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
	cpu.report(b)
}

// BenchmarkWithTimeoutBaseline is what a hand-written attempt timeout costs:
// the baseline for BenchmarkDoAttemptTimeout.
func BenchmarkWithTimeoutBaseline(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		actx, cancel := context.WithTimeout(ctx, time.Second)
		_, _ = okOp(actx)
		cancel()
	}
	cpu.report(b)
}

func BenchmarkDoAttemptTimeout(b *testing.B) {
	p := &guardrail.Policy{Retry: guardrail.Retry{AttemptTimeout: time.Second}}
	ctx := context.Background()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
	cpu.report(b)
}

// BenchmarkDoAttemptTimeoutParentSooner: the caller's deadline is sooner
// than the attempt timeout, so no timer is needed.
func BenchmarkDoAttemptTimeoutParentSooner(b *testing.B) {
	p := &guardrail.Policy{Retry: guardrail.Retry{AttemptTimeout: time.Hour}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
	cpu.report(b)
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
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
	cpu.report(b)
}

// BenchmarkDoBulkhead adds a bulkhead to the default policy.
func BenchmarkDoBulkhead(b *testing.B) {
	p := &guardrail.Policy{Bulkhead: newBulkhead(bulkhead.Config{MaxConcurrent: 64})}
	ctx := context.Background()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
	cpu.report(b)
}

// BenchmarkDoObserved attaches an observer that does nothing: the cost of
// building and delivering the events.
func BenchmarkDoObserved(b *testing.B) {
	p := &guardrail.Policy{Observer: event.ObserverFunc(func(ctx context.Context, _ event.Event) context.Context { return ctx })}
	ctx := context.Background()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
	cpu.report(b)
}

var errBench = errors.New("bench: refused")

func permanentOp(context.Context) (int, error) { return 0, guardrail.Permanent(errBench) }

// BenchmarkDoPermanentError is the failure path that makes one attempt: the
// operation fails with an error that is not retried.
func BenchmarkDoPermanentError(b *testing.B) {
	p := &guardrail.Policy{}
	ctx := context.Background()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, permanentOp)
	}
	cpu.report(b)
}

// BenchmarkDoCircuitOpen is the failure path that makes no attempt: the
// breaker is open and Do rejects the call.
func BenchmarkDoCircuitOpen(b *testing.B) {
	br := newBreaker(breaker.Config{})
	br.ForceOpen()
	p := &guardrail.Policy{Breaker: br}
	ctx := context.Background()
	b.ReportAllocs()
	cpu := startCPU()
	for b.Loop() {
		_, _ = guardrail.Do(ctx, p, okOp)
	}
	cpu.report(b)
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
			p := &guardrail.Policy{Retry: guardrail.Retry{
				MaxAttempts: 1,
			},
				Classify: tc.c,
				Breaker:  newBreaker(breaker.Config{Mode: breaker.Disabled})}
			ctx := context.Background()
			b.ReportAllocs()
			cpu := startCPU()
			for b.Loop() {
				_, _ = guardrail.Do(ctx, p, transientOp)
			}
			cpu.report(b)
		})
	}
}

// BenchmarkDoFailedAttemptDeadline is BenchmarkDoFailedAttempt with the
// trivial classifier and a deadline on the caller's context.
func BenchmarkDoFailedAttemptDeadline(b *testing.B) {
	p := &guardrail.Policy{Retry: guardrail.Retry{
		MaxAttempts: 1,
	},
		Classify: trivialClassify,
		Breaker:  newBreaker(breaker.Config{Mode: breaker.Disabled})}
	b.Run("deadline=1h", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		b.ReportAllocs()
		cpu := startCPU()
		for b.Loop() {
			_, _ = guardrail.Do(ctx, p, transientOp)
		}
		cpu.report(b)
	})
	b.Run("deadline=800ms", func(b *testing.B) {
		next, stop := nearDeadlines()
		defer stop()
		b.ReportAllocs()
		cpu := startCPU()
		for b.Loop() {
			_, _ = guardrail.Do(next(), p, transientOp)
		}
		cpu.report(b)
	})
}

// BenchmarkDoRetries is a call whose three attempts all fail, retried at
// once (no backoff), with a breaker that records every attempt in its
// time window but never opens, so that every call makes its three
// attempts: the failure path of an outage, per call.
func BenchmarkDoRetries(b *testing.B) {
	p := &guardrail.Policy{Idempotent: true, Classify: trivialClassify, Retry: guardrail.Retry{
		Backoff: backoff.None(),
		Budget:  budget.Unlimited(),
	},
		Breaker: newBreaker(breaker.Config{Mode: breaker.MetricsOnly})}
	run := func(b *testing.B, ctx func() context.Context) {
		b.ReportAllocs()
		cpu := startCPU()
		for b.Loop() {
			// ErrDeadline only after the benchmark stalled for most of
			// nearDeadline (the machine is shared).
			if _, err := guardrail.Do(ctx(), p, transientOp); !errors.Is(err, errTransient) && !errors.Is(err, guardrail.ErrDeadline) {
				b.Fatal(err)
			}
		}
		cpu.report(b)
	}
	b.Run("deadline=none", func(b *testing.B) {
		run(b, context.Background)
	})
	b.Run("deadline=1h", func(b *testing.B) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
		defer cancel()
		run(b, func() context.Context { return ctx })
	})
	b.Run("deadline=800ms", func(b *testing.B) {
		next, stop := nearDeadlines()
		defer stop()
		run(b, next)
	})
}
