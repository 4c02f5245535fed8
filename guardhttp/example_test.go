package guardhttp_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/backoff"
	"github.com/guardrail-go/guardrail/guardhttp"
)

func Example() {
	// A server that is overloaded once, then answers.
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0")
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, "hello, attempt %s", r.Header.Get("X-Retry-Attempt"))
	}))
	defer srv.Close()

	client, err := guardhttp.NewClient(guardhttp.Config{
		Name: "greeter",
		Retry: guardrail.Retry{
			Backoff: backoff.None(),
		},
		// for the example; keep the default jitter in production
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.CloseIdleConnections()

	resp, err := client.Get(srv.URL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body), "after", calls.Load(), "calls")
	// Output: 200 hello, attempt 1 after 2 calls
}

// A POST is retried only when an idempotency key makes that safe.
func Example_idempotencyKeys() {
	var mu sync.Mutex
	var keys []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		if len(keys) == 1 {
			http.Error(w, "busy", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	client, err := guardhttp.NewClient(guardhttp.Config{IdempotencyKeys: true, Retry: guardrail.Retry{Backoff: backoff.None()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.CloseIdleConnections()

	resp, err := client.Post(srv.URL, "application/json", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	fmt.Println(resp.StatusCode, len(keys), "attempts, same key:", keys[0] == keys[1] && len(keys[0]) == 32)
	// Output: 201 2 attempts, same key: true
}

// A server that takes too long to answer: the error names the phase that
// ran out, and the request was tried as often as allowed.
func ExampleTimeoutError() {
	stop := make(chan struct{})
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		select { // never answers
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	defer srv.Close()
	defer close(stop)

	client, err := guardhttp.NewClient(guardhttp.Config{
		Name: "slow",
		Retry: guardrail.Retry{
			MaxAttempts: 2,
			Backoff:     backoff.None(),
		},
		ResponseHeaderTimeout: 50 * time.Millisecond,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.CloseIdleConnections()

	_, err = client.Get(srv.URL)
	var te *guardhttp.TimeoutError
	if errors.As(err, &te) {
		fmt.Println(te.Phase, te.After, te.Dependency, "after", calls.Load(), "calls")
	}
	// Output: response_header 50ms slow after 2 calls
}

// A Config is checked when the client is built.
func ExampleNewClient_invalid() {
	_, err := guardhttp.NewClient(guardhttp.Config{Retry: guardrail.Retry{MaxAttempts: -1}})
	fmt.Println(err)
	fmt.Println(errors.Is(err, guardhttp.ErrInvalidConfig))
	// Output:
	// guardhttp: Config.MaxAttempts is -1; want 1 or more, or zero for the default
	// true
}

// A Transport over a connection pool of one's own: here, to keep more idle
// connections per host. Bound its dial and its TLS handshake too, so that
// a dial no request waits for any more does not linger.
func ExampleNewTransport() {
	base := &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: guardhttp.DefaultConnectTimeout}).DialContext,
		TLSHandshakeTimeout: guardhttp.DefaultTLSHandshakeTimeout,
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 256,
	}
	rt, err := guardhttp.NewTransport(base, guardhttp.Config{Name: "search"})
	if err != nil {
		fmt.Println(err)
		return
	}
	client := &http.Client{Transport: rt}
	defer client.CloseIdleConnections()
	fmt.Println(rt.Breakers() != nil, rt.RetryBudget() != nil)
	// Output: true true
}
