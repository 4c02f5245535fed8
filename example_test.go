package guardrail_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
)

func Example() {
	p := &guardrail.Policy{
		Name:           "pricing",
		AttemptTimeout: 1200 * time.Millisecond,
		Idempotent:     true, // a read: safe to repeat
		Backoff:        backoff.None(),
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
	p := &guardrail.Policy{Name: "payments", AttemptTimeout: 10 * time.Millisecond}
	_, err := guardrail.Do(context.Background(), p, func(ctx context.Context) (string, error) {
		<-ctx.Done() // the provider took the request and went quiet
		return "", ctx.Err()
	})
	fmt.Println(errors.Is(err, guardrail.ErrOutcomeUnknown))
	// Output: true
}
