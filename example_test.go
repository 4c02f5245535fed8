package guardrail_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/event"
)

func Example() {
	p := &guardrail.Policy{
		Name: "pricing",
		Retry: guardrail.Retry{
			AttemptTimeout: 1200 * time.Millisecond,
			Backoff:        backoff.None(),
		},
		Idempotent: true, // a read: safe to repeat
	}
	calls := 0
	price, err := guardrail.Do(context.Background(), p, func(ctx context.Context) (int, error) {
		calls++
		if calls == 1 {
			return 0, guardrail.Transient(errors.New("503 from pricing"))
		}
		return 100, nil
	})
	fmt.Println(price, err, calls)
	// Output: 100 <nil> 2
}

// A timed-out payment must not be retried without an idempotency key: the
// charge may have gone through.
func Example_outcomeUnknown() {
	p := &guardrail.Policy{Name: "payments", Retry: guardrail.Retry{AttemptTimeout: 10 * time.Millisecond}}
	_, err := guardrail.Do(context.Background(), p, func(ctx context.Context) (string, error) {
		<-ctx.Done() // the provider took the request and went quiet
		return "", ctx.Err()
	})
	fmt.Println(errors.Is(err, guardrail.ErrOutcomeUnknown))
	// Output: true
}

// An HTTP-like caller decides idempotence per request: the zero Call
// follows the Policy, Idempotent and NotIdempotent override it.
func ExampleDoCall() {
	p := &guardrail.Policy{Name: "orders", Retry: guardrail.Retry{Backoff: backoff.None()}} // not idempotent by default
	attempts := 0
	failOnce := func(ctx context.Context) (string, error) {
		if attempts++; attempts == 1 {
			return "", errors.New("connection reset")
		}
		return "ok", nil
	}

	_, err := guardrail.DoCall(context.Background(), p, guardrail.Call{Dependency: "orders POST"}, failOnce)
	fmt.Println("POST:", attempts, "attempt(s),", err)

	attempts = 0
	v, err := guardrail.DoCall(context.Background(), p, guardrail.Call{Dependency: "orders GET", Idempotent: guardrail.Idempotent}, failOnce)
	fmt.Println("GET:", attempts, "attempt(s),", v, err)
	// Output:
	// POST: 1 attempt(s), connection reset
	// GET: 2 attempt(s), ok <nil>
}

// Policies that call one failure domain share a breaker. Whoever builds it
// observes it: its transitions go to the Observer in its breaker.Config,
// once each, however many policies use it.
func ExamplePolicy_sharedBreaker() {
	logTransitions := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.BreakerTransition {
			fmt.Println(e.Dependency, e.From, "->", e.To)
		}
		return ctx
	})
	db, err := breaker.New(breaker.Config{Name: "orders-db", Observer: logTransitions})
	if err != nil {
		fmt.Println(err)
		return
	}
	reads := &guardrail.Policy{Name: "orders-read", Idempotent: true, Breaker: db}
	writes := &guardrail.Policy{Name: "orders-write", Breaker: db}

	db.ForceOpen() // maintenance
	_, err = guardrail.Do(context.Background(), reads, func(context.Context) (int, error) { return 1, nil })
	fmt.Println(errors.Is(err, guardrail.ErrCircuitOpen))
	_, err = guardrail.Do(context.Background(), writes, func(context.Context) (int, error) { return 1, nil })
	fmt.Println(errors.Is(err, guardrail.ErrCircuitOpen))
	// Output:
	// orders-db closed -> open
	// true
	// true
}

// An invalid Policy is reported by the first call, every invalid field by
// name, without running the operation.
func ExamplePolicy_invalid() {
	p := &guardrail.Policy{Name: "pricing", Retry: guardrail.Retry{MaxAttempts: -1}}
	_, err := guardrail.Do(context.Background(), p, func(context.Context) (int, error) { return 1, nil })
	fmt.Println(errors.Is(err, guardrail.ErrInvalidConfig))
	fmt.Println(err)
	// Output:
	// true
	// guardrail: invalid config "pricing": Policy.MaxAttempts is -1; want 1 or more, or zero for the default
}
