package ratelimit_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/guardrail-go/guardrail/extra/ratelimit"
)

// Each API key gets its own bucket: two requests per second, in bursts of
// two. The third request of a key in the same instant is answered 429 with
// the whole seconds to wait; another key is not affected.
func Example() {
	l, err := ratelimit.New(ratelimit.Config{
		Name: "api",
		Key: func(r *http.Request) (string, error) {
			return r.Header.Get("X-Api-Key"), nil // "" is the shared bucket of anonymous calls
		},
		Rate:  2,
		Burst: 2,
	})
	if err != nil {
		panic(err)
	}
	h := l.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}))
	for _, key := range []string{"alice", "alice", "alice", "bob"} {
		r := httptest.NewRequest("GET", "/orders", nil)
		r.Header.Set("X-Api-Key", key)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if ra := w.Header().Get("Retry-After"); ra != "" {
			fmt.Println(key, w.Code, "Retry-After:", ra)
		} else {
			fmt.Println(key, w.Code, w.Body.String())
		}
	}
	// Output:
	// alice 200 ok
	// alice 200 ok
	// alice 429 Retry-After: 1
	// bob 200 ok
}

// With the default key, a client is its IP address, and an IPv6 client is
// its /64: a host that answers from another address of its block is still
// the same client.
func Example_byAddress() {
	l, err := ratelimit.New(ratelimit.Config{Rate: 1, Burst: 1})
	if err != nil {
		panic(err)
	}
	h := l.Middleware(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, peer := range []string{
		"[2001:db8:1:2::1]:50000",
		"[2001:db8:1:2:dead:beef:1:2]:50001", // the same /64
		"[2001:db8:1:3::1]:50000",            // the next /64
		"192.0.2.1:40000",
		"[::ffff:192.0.2.1]:40001", // the same IPv4 client, over a dual-stack listener
	} {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = peer
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(peer, w.Code)
	}
	// Output:
	// [2001:db8:1:2::1]:50000 200
	// [2001:db8:1:2:dead:beef:1:2]:50001 429
	// [2001:db8:1:3::1]:50000 200
	// 192.0.2.1:40000 200
	// [::ffff:192.0.2.1]:40001 429
}
