package lab

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
)

// statusError is a non-2xx answer turned into an error so Do can classify it.
type statusError struct{ code int }

func (e statusError) Error() string { return fmt.Sprintf("HTTP %d", e.code) }

// guardedGet issues GET url under p with client, reading and closing the
// body. 5xx and 429 are transient (with the server's Retry-After), other
// non-2xx permanent.
func guardedGet(ctx context.Context, client *http.Client, p *guardrail.Policy, url string) (int, error) {
	return guardrail.Do(ctx, p, func(ctx context.Context) (int, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return 0, guardrail.Permanent(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		switch code := resp.StatusCode; {
		case code < 400:
			return code, nil
		case code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable:
			if d, ok := backoff.ParseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
				return code, guardrail.RetryAfterError(statusError{code}, d)
			}
			return code, guardrail.Transient(statusError{code})
		case code >= 500:
			return code, guardrail.Transient(statusError{code})
		default:
			return code, guardrail.Permanent(statusError{code})
		}
	})
}

// newHTTPClient returns a client with its own connection pool.
func newHTTPClient(keepAlive bool) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DisableKeepAlives = !keepAlive
	t.MaxIdleConnsPerHost = 256
	return &http.Client{Transport: t}
}
