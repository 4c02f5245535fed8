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
	"github.com/hashicorp/go-retryablehttp"
)

// plainTransport is the connection pool every client below is given (or,
// for guardhttp, builds itself with the same settings), so the rows differ
// only by what each library wraps around it.
func plainTransport() *http.Transport {
	d := &net.Dialer{Timeout: 1500 * time.Millisecond, KeepAlive: 30 * time.Second}
	return &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          256,
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   3 * time.Second,
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
	for _, c := range clients {
		b.Run("impl="+c.name, func(b *testing.B) {
			req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, srv.URL, nil)
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
		c.client.CloseIdleConnections()
	}
}
