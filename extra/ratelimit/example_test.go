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
