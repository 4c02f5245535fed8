package breaker_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/event"
)

func Example() {
	b, err := breaker.New(breaker.Config{
		Name:        "pricing",
		MinRequests: 5, // a small volume to keep the example short; the default is 20
		Observer: event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
			fmt.Printf("%s: %s -> %s: %s\n", e.Dependency, e.From, e.To, e.Detail)
			return ctx
		}),
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	errUnavailable := errors.New("503 service unavailable")
	reached, failedFast := 0, 0
	getPrice := func() error { reached++; return errUnavailable }

	for range 30 {
		if err := b.Execute(getPrice); errors.Is(err, breaker.ErrOpen) {
			failedFast++ // answer from a local cache, marked stale
		}
	}
	fmt.Println("reached pricing:", reached, "failed fast:", failedFast)
	// Output:
	// pricing: closed -> open: failure rate 1 of 5 calls >= 0.5
	// reached pricing: 5 failed fast: 25
}

// The two-step form, for middleware: ask, call, report the outcome and the
// duration.
func ExampleBreaker_Allow() {
	b, err := breaker.New(breaker.Config{SlowCall: 2 * time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}

	call := func() (status int, err error) { return http.StatusNotFound, nil }

	p, err := b.Allow()
	if err != nil {
		fmt.Println("rejected:", err)
		return
	}
	start := time.Now()
	status, err := call()
	outcome := breaker.Success
	switch {
	case err != nil || status >= 500 || status == http.StatusTooManyRequests:
		outcome = breaker.Failure
	case status >= 400:
		outcome = breaker.Ignored // the request was wrong, not the dependency
	}
	p.Done(outcome, time.Since(start))

	m := b.Metrics()
	fmt.Println(m.State, "calls counted:", m.Calls)
	// Output: closed calls counted: 0
}

// A server turns the rejection into Retry-After.
func ExampleOpenError() {
	b, err := breaker.New(breaker.Config{MinRequests: 1, OpenFor: 30 * time.Second, OpenJitter: -1})
	if err != nil {
		fmt.Println(err)
		return
	}
	b.Execute(func() error { return errors.New("connection refused") })

	_, err = b.Allow()
	var open *breaker.OpenError
	if errors.As(err, &open) {
		secs := int(math.Ceil(open.RetryIn().Seconds()))
		fmt.Println("503, Retry-After:", strconv.Itoa(secs))
	}
	// Output: 503, Retry-After: 30
}

func ExampleGroup() {
	// One breaker per region: an outage in one must not block the others.
	g, err := breaker.NewGroup(breaker.GroupConfig{
		Config:  breaker.Config{MinRequests: 3},
		MaxKeys: 100,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for range 3 {
		g.Get("eu-west").Execute(func() error { return errors.New("timeout") })
		g.Get("us-east").Execute(func() error { return nil })
	}
	fmt.Println("eu-west:", g.Get("eu-west").State())
	fmt.Println("us-east:", g.Get("us-east").State())
	// Output:
	// eu-west: open
	// us-east: closed
}

func ExampleBreaker_ForceOpen() {
	b, err := breaker.New(breaker.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	b.ForceOpen() // maintenance window: keep traffic off the dependency
	fmt.Println(b.Execute(func() error { return nil }))
	b.Reset()
	fmt.Println(b.Execute(func() error { return nil }))
	// Output:
	// breaker: open (forced)
	// <nil>
}

// New names every field it rejects.
func ExampleNew_invalid() {
	_, err := breaker.New(breaker.Config{FailureRate: 1.5, HalfOpenProbes: -1})
	fmt.Println(errors.Is(err, breaker.ErrInvalidConfig))
	fmt.Println(err)
	// Output:
	// true
	// breaker: Config.FailureRate is 1.5; want a value in (0, 1], or zero for the default
	// breaker: Config.HalfOpenProbes is -1; want a positive count, or zero for the default
}

// Whoever builds a breaker observes it: its transitions reach the
// Observer in its Config once, however many policies share it.
func ExampleConfig_observer() {
	logTransitions := event.ObserverFunc(func(ctx context.Context, e event.Event) context.Context {
		if e.Kind == event.BreakerTransition {
			fmt.Printf("%s: %s -> %s (%s)\n", e.Dependency, e.From, e.To, e.Reason)
		}
		return ctx
	})
	b, err := breaker.New(breaker.Config{Name: "payments", Observer: logTransitions})
	if err != nil {
		fmt.Println(err)
		return
	}
	b.ForceOpen()
	b.Reset()
	// Output:
	// payments: closed -> open (forced_open)
	// payments: open -> closed (reset)
}
