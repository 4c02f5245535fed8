package breaker_test

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/guardrail-go/guardrail/breaker"
)

func Example() {
	b := breaker.New(breaker.Config{
		Name:        "pricing",
		MinRequests: 5, // a small volume to keep the example short; the default is 20
		OnTransition: func(t breaker.Transition) {
			fmt.Printf("%s: %s -> %s: %s\n", t.Name, t.From, t.To, t.Cause)
		},
	})
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
	b := breaker.New(breaker.Config{SlowCall: 2 * time.Second})

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
	b := breaker.New(breaker.Config{MinRequests: -1, OpenFor: 30 * time.Second, OpenJitter: -1})
	b.Execute(func() error { return errors.New("connection refused") })

	_, err := b.Allow()
	var open *breaker.OpenError
	if errors.As(err, &open) {
		secs := int(math.Ceil(open.RetryIn().Seconds()))
		fmt.Println("503, Retry-After:", strconv.Itoa(secs))
	}
	// Output: 503, Retry-After: 30
}

func ExampleGroup() {
	// One breaker per region: an outage in one must not block the others.
	g := breaker.NewGroup(breaker.GroupConfig{
		Config:  breaker.Config{MinRequests: 3},
		MaxKeys: 100,
	})
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
	b := breaker.New(breaker.Config{})
	b.ForceOpen() // maintenance window: keep traffic off the dependency
	fmt.Println(b.Execute(func() error { return nil }))
	b.Reset()
	fmt.Println(b.Execute(func() error { return nil }))
	// Output:
	// breaker: open (forced)
	// <nil>
}
