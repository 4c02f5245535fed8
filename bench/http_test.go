package bench

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/circuitbreaker"
	"github.com/failsafe-go/failsafe-go/failsafehttp"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/hashicorp/go-retryablehttp"
)

// Every client below is given the connection pool guardhttp.NewClient
// builds for itself (plainTransport), without its guard, so the rows
// differ only by what each library wraps around it.

// plainTransport is the connection pool guardhttp.NewClient builds for
// itself: HTTP/2 when offered, 64 idle connections per host, proxies from
// the environment, a bounded dial and TLS handshake.
func plainTransport() *http.Transport {
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: guardhttp.DefaultConnectTimeout, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          4 * guardhttp.DefaultMaxIdleConnsPerHost,
		MaxIdleConnsPerHost:   guardhttp.DefaultMaxIdleConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   guardhttp.DefaultTLSHandshakeTimeout,
		ExpectContinueTimeout: time.Second,
	}
}

// httpClient is one row of BenchmarkHTTP.
type httpClient struct {
	name   string
	client *http.Client
}

// peerHTTPClients are the clients of the other libraries.
func peerHTTPClients() []httpClient {
	// failsafe-go: its HTTP retry policy (retries errors, 429 and 5xx,
	// honours Retry-After) and a circuit breaker that counts errors, 429
	// and 5xx, configured as in BenchmarkBreaker. One breaker for the
	// client: failsafehttp has no breaker per host.
	retry := failsafehttp.NewRetryPolicyBuilder().
		WithMaxAttempts(maxAttempts).
		WithBackoff(backoffBase, backoffCap).
		Build()
	cb := circuitbreaker.NewBuilder[*http.Response]().
		HandleIf(func(r *http.Response, err error) bool {
			return err != nil || r.StatusCode == http.StatusTooManyRequests || r.StatusCode >= 500
		}).
		WithFailureRateThreshold(failureRate, minRequests, window).
		WithDelay(30 * time.Second).
		WithJitterFactor(0.2).
		Build()

	// go-retryablehttp: 2 retries, its logger off (by default it logs
	// every request), over the same pool.
	rc := retryablehttp.NewClient()
	rc.HTTPClient = &http.Client{Transport: plainTransport()}
	rc.RetryMax = maxAttempts - 1
	rc.RetryWaitMin, rc.RetryWaitMax = backoffBase, backoffCap
	rc.Logger = nil

	return []httpClient{
		{"failsafehttp", &http.Client{Transport: failsafehttp.NewRoundTripper(plainTransport(), retry, cb)}},
		{"retryablehttp", rc.StandardClient()},
	}
}

// BenchmarkHTTP is a GET on a loopback server that answers "ok" at once,
// with the response body read and closed, through each client: what each
// library adds to a real request. goroutines/op and cpu-ns/op count the
// whole process, server included: net/http's server starts one goroutine
// per request (its background read of the connection), so 1.00 is the
// floor here and anything above it is the client's.
func BenchmarkHTTP(b *testing.B) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ok")
	}))
	defer srv.Close()
	clients := []httpClient{{"plain", &http.Client{Transport: plainTransport()}}}
	clients = append(clients, guardhttpClients()...)
	clients = append(clients, peerHTTPClients()...)
	for _, deadline := range []string{"none", "1h"} {
		for _, c := range clients {
			benchGet(b, srv.URL, c, deadline)
		}
	}
	for _, c := range clients {
		c.client.CloseIdleConnections()
	}
}

// benchGet measures GETs of url through c. With a deadline ("1h") the
// request's context has one, as a caller's usually does: guardhttp then
// announces the time left to the server in headers.
func benchGet(b *testing.B, url string, c httpClient, deadline string) {
	b.Run("deadline="+deadline+"/impl="+c.name, func(b *testing.B) {
		ctx := context.Background()
		if deadline != "none" {
			d, err := time.ParseDuration(deadline)
			if err != nil {
				b.Fatal(err)
			}
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			b.Fatal(err)
		}
		get := func() {
			resp, err := c.client.Do(req)
			if err != nil {
				b.Fatal(err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
		}
		get() // open the connection outside the measurement
		loop(b, get)
	})
}
