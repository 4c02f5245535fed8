package lab

import (
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// statusError is a non-2xx answer turned into an error.
type statusError struct{ code int }

func (e statusError) Error() string { return fmt.Sprintf("HTTP %d", e.code) }

// newHTTPClient returns a plain client with its own connection pool: the
// load generators' and the users' client, which guard nothing.
func newHTTPClient(keepAlive bool) *http.Client {
	return &http.Client{Transport: newBaseTransport(keepAlive)}
}

func newBaseTransport(keepAlive bool) *http.Transport {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DisableKeepAlives = !keepAlive
	t.MaxIdleConnsPerHost = 256
	return t
}

// guarded returns a guardhttp client over a pool of its own.
func guarded(keepAlive bool, cfg guardhttp.Config) *http.Client {
	return &http.Client{Transport: mustTransport(newBaseTransport(keepAlive), cfg)}
}

// mustTransport is guardhttp.NewTransport for the experiments' Configs,
// which are written in the code: an invalid one is a bug of the lab.
func mustTransport(base http.RoundTripper, cfg guardhttp.Config) *guardhttp.Transport {
	t, err := guardhttp.NewTransport(base, cfg)
	if err != nil {
		panic("lab: " + err.Error())
	}
	return t
}

// noBreakers is a breaker group whose breakers never trip, for experiments
// that measure something else.
func noBreakers() *breaker.Group {
	g, _ := breaker.NewGroup(breaker.GroupConfig{Config: breaker.Config{Mode: breaker.Disabled}}) // a valid Config
	return g
}

// get issues GET url, reads and closes the body, and returns the status; a
// status of 400 or more is also returned as a statusError.
func get(ctx context.Context, c *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if resp.StatusCode >= 400 {
		return resp.StatusCode, statusError{resp.StatusCode}
	}
	return resp.StatusCode, nil
}

// disabledBreaker is a breaker that admits every call and records nothing.
func disabledBreaker() *breaker.Breaker {
	b, _ := breaker.New(breaker.Config{Mode: breaker.Disabled}) // a valid Config
	return b
}
