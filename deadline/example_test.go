package deadline_test

import (
	"fmt"
	"net/http"
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
