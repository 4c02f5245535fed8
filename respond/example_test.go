package respond_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/respond"
)

// A handler that calls a dependency answers its own client with the
// status the dependency's failure calls for.
func ExampleError() {
	handler := func(w http.ResponseWriter, r *http.Request) {
		// What a call through guardrail.Do or a guardhttp client returns
		// while the dependency's breaker is open.
		err := &guardrail.Error{Kind: guardrail.ErrCircuitOpen, RetryIn: 4500 * time.Millisecond}
		respond.Error(w, err)
	}
	w := httptest.NewRecorder()
	handler(w, httptest.NewRequest("GET", "/quote", nil))
	fmt.Println(w.Code, w.Header().Get("Retry-After"), w.Body.String())
	// Output: 503 5 circuit open
}

// Status gives the status and Retry-After, for a handler that writes a
// body of its own (JSON, say).
func ExampleStatus() {
	status, retryAfter := respond.Status(guardrail.ErrOutcomeUnknown)
	fmt.Println(status, retryAfter)
	// Output: 502 0s
}
