package guardhttp_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"

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

	client := guardhttp.NewClient(guardhttp.Config{
		Name:    "greeter",
		Backoff: backoff.None(), // for the example; keep the default jitter in production
	})
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

	client := guardhttp.NewClient(guardhttp.Config{IdempotencyKeys: true, Backoff: backoff.None()})
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

// NewClient's connection pool under a Transport of one's own: here, to
// keep more idle connections per host.
func ExampleBaseTransport() {
	base := guardhttp.BaseTransport(guardhttp.Config{})
	base.MaxIdleConnsPerHost = 256
	client := &http.Client{Transport: guardhttp.NewTransport(base, guardhttp.Config{Name: "search"})}
	defer client.CloseIdleConnections()
	fmt.Println(base.MaxIdleConnsPerHost, base.TLSHandshakeTimeout, base.ResponseHeaderTimeout)
	// Output: 256 3s 0s
}
