package backoff_test

import (
	"fmt"
	"net/http"
	"time"

	"github.com/guardrail-go/guardrail/backoff"
)

func Example() {
	s := backoff.FullJitter(100*time.Millisecond, 10*time.Second)
	// The caller supplies the random draw: 0.5 puts each delay mid-window.
	for retry := range 4 {
		fmt.Println(s.Delay(retry, 0, 0.5))
	}
	// Output:
	// 50ms
	// 100ms
	// 200ms
	// 400ms
}

func ExampleParseRetryAfter() {
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for _, v := range []string{"3", "Mon, 30 Nov 2026 12:00:10 GMT", "-1", "soon"} {
		d, ok := backoff.ParseRetryAfter(v, now)
		fmt.Println(d, ok)
	}
	// Output:
	// 3s true
	// 10s true
	// 0s false
	// 0s false
}

// A response that carries Retry-After twice: the longer delay is the safe
// reading.
func ExampleParseRetryAfterValues() {
	h := http.Header{}
	h.Add("Retry-After", "1")
	h.Add("Retry-After", "2")
	d, ok := backoff.ParseRetryAfterValues(h.Values("Retry-After"), time.Now())
	fmt.Println(d, ok)
	// Output: 2s true
}
