package deadline_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/guardrail-go/guardrail/deadline"
)

func Example() {
	now := time.UnixMilli(1_780_000_000_000)

	// The caller has 1.9 s left and sends it along.
	h := http.Header{}
	deadline.Set(h, now, 1900*time.Millisecond)
	fmt.Println(h.Get(deadline.HeaderTimeout), h.Get(deadline.HeaderDeadline))

	// The receiver allows itself at most 1 s, whatever the caller asks.
	left, ok := deadline.FromHeader(h, now, time.Second)
	fmt.Println(left, ok)
	// Output:
	// 1900 1780000001900
	// 1s true
}

// The middleware gives the handler the caller's deadline, capped at the
// server's Max, and answers a request whose deadline has passed without
// running the handler.
func ExampleServer_Middleware() {
	dl, err := deadline.New(deadline.Config{Max: 2 * time.Second})
	if err != nil {
		panic(err)
	}
	h := dl.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, ok := r.Context().Deadline()
		fmt.Fprintln(w, "deadline set:", ok)
	}))
	for _, timeout := range []string{"1900", "0"} {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set(deadline.HeaderTimeout, timeout)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Print(w.Code, " ", w.Body.String())
	}
	// Output:
	// 200 deadline set: true
	// 504 deadline already passed
}
