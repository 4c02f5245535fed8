package chain_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/guardrail-go/guardrail/chain"
	"github.com/guardrail-go/guardrail/shed"
)

// A server that calls other services puts the chain's Middleware outside
// the others, so that a refusal at its door tells the caller that nothing
// ran, and a failure after its own retries tells the caller not to retry.
func Example() {
	cs, err := chain.New(chain.Config{Name: "checkout"})
	if err != nil {
		panic(err)
	}
	sh, err := shed.New(shed.Config{Limit: 100})
	if err != nil {
		panic(err)
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Calls made here through guardrail.Do or a guardhttp client see
		// the request's chain.State in r.Context().
		fmt.Println("amplification:", chain.FromContext(r.Context()).Amplification())
	})
	h := cs.Middleware(sh.Middleware(handler))

	r := httptest.NewRequest(http.MethodGet, "/pay", nil)
	r.Header.Set(chain.HeaderAmplification, "3") // the third send of the user's request
	h.ServeHTTP(httptest.NewRecorder(), r)
	// Output: amplification: 3
}
