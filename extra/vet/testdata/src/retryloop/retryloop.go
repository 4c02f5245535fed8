package retryloop

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"time"
)

var errPermanent = errors.New("permanent")

func constantDelay(c *http.Client, req *http.Request) (*http.Response, error) {
	var err error
	for i := 0; i < 3; i++ { // want `\[retryloop\] retry loop sleeps a constant delay with no jitter` `retries every error without classifying it` `sleeps without watching req.Context\(\)`
		var resp *http.Response
		resp, err = c.Do(req)
		if err == nil {
			return resp, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return nil, err
}

func exponential(ctx context.Context, op func(context.Context) error) error {
	delay := 50 * time.Millisecond
	var err error
	for attempt := 0; attempt < 5; attempt++ { // want `sleeps an exponential delay with no jitter` `sleeps without watching ctx`
		if err = op(ctx); err == nil {
			return nil
		}
		if errors.Is(err, errPermanent) {
			return err
		}
		time.Sleep(delay)
		delay *= 2
	}
	return err
}

func shifted(op func() error) error {
	var err error
	for i := 0; i < 4; i++ { // want `sleeps an exponential delay`
		err = op()
		if err == nil {
			break
		}
		if !retryable(err) {
			return err
		}
		time.Sleep(time.Duration(1<<i) * 10 * time.Millisecond)
	}
	return err
}

func retryable(err error) bool { return true }

func unbounded(url string) *http.Response {
	for { // want `has no bound` `retries every error`
		resp, err := http.Get(url)
		if err == nil {
			return resp
		}
		time.Sleep(time.Second + time.Duration(rand.Int64N(int64(time.Second))))
	}
}

func untilNoError(op func() error) {
	err := op()
	for err != nil { // want `has no bound` `retries every error`
		select {
		case <-time.After(time.Duration(rand.Float64() * float64(time.Second))):
		}
		err = op()
	}
}

// good is what a careful hand-written loop looks like: bounded, jittered,
// classified, watching the context.
func good(ctx context.Context, op func(context.Context) error) error {
	var err error
	for i := 0; i < 3; i++ {
		if err = op(ctx); err == nil {
			return nil
		}
		if !retryable(err) {
			return err
		}
		d := time.Duration(rand.Int64N(int64(100 * time.Millisecond << i)))
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(d):
		}
	}
	return err
}

// poll is not a retry: it does not end when the call succeeds.
func poll(c *http.Client, req *http.Request) {
	for {
		resp, err := c.Do(req)
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		resp.Body.Close()
		time.Sleep(time.Second)
	}
}

// noSleep retries at once: no delay to judge.
func noSleep(op func() error) error {
	var err error
	for i := 0; i < 3; i++ {
		if err = op(); err == nil {
			return nil
		}
	}
	return err
}

// backoffFrom sleeps what a backoff strategy says: we cannot see it.
func backoffFrom(op func() error, next func(int) time.Duration) error {
	var err error
	for i := 0; i < 3; i++ {
		if err = op(); err == nil {
			return nil
		}
		if !retryable(err) {
			return err
		}
		time.Sleep(next(i))
	}
	return err
}

// statusRetry classifies by status code and bounds by a deadline.
func statusRetry(c *http.Client, req *http.Request) {
	deadline := time.Now().Add(time.Minute)
	for { // want `sleeps a constant delay` `sleeps without watching req.Context\(\)`
		resp, err := c.Do(req)
		if err == nil && resp.StatusCode < 500 {
			return
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Second)
	}
}

func suppressed(op func() error) {
	//guardrail:ignore retryloop local tool, one user, no herd to desynchronise
	for {
		if err := op(); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
}

type Operation func() error

type Backoff interface {
	Next(n int) (time.Duration, bool)
}

// strategy leaves the bound and the delay to a strategy we cannot see.
func strategy(operation Operation, b Backoff, notify func(error)) error {
	var err error
	n := 0
	for {
		if err = operation(); err == nil {
			return nil
		}
		n++
		wait, retry := b.Next(n)
		if !retry {
			return err
		}
		notify(err)
		time.Sleep(wait)
	}
}

// namedOp is a retry through a named func type, with a constant delay.
func namedOp(operation Operation) error {
	var err error
	for i := 0; i < 3; i++ { // want `sleeps a constant delay` `retries every error`
		if err = operation(); err == nil {
			return nil
		}
		time.Sleep(time.Second)
	}
	return err
}
