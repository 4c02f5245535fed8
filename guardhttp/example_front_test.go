package guardhttp_test

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/breaker"
	"github.com/guardrail-go/guardrail/guardhttp"
	"github.com/guardrail-go/guardrail/idempotency"
)

// The *Transport under a client built by NewClient gives its budget and
// breakers, to export them as metrics, say. Config.Breaker tunes every
// key's breaker in one field; its transitions still go to Config.Observer.
func ExampleNewClient_metrics() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}))
	defer srv.Close()

	client, err := guardhttp.NewClient(guardhttp.Config{
		Name:    "pricing",
		Breaker: breaker.Config{MinRequests: 50, OpenFor: 10 * time.Second},
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
	resp.Body.Close()

	t := client.Transport.(*guardhttp.Transport)
	fmt.Println("retry tokens at most:", t.RetryBudget().Max())
	t.Breakers().Range(func(_ string, b *breaker.Breaker) bool {
		fmt.Println("breaker state:", b.State())
		return true
	})
	// Output:
	// retry tokens at most: 10
	// breaker state: closed
}

// The key a request was given is on its error, to send the same intent
// again later. For an intent that may be sent again after this process is
// gone, derive the key from a business ID instead.
func ExampleIdempotencyKeyError() {
	client, _ := guardhttp.NewClient(guardhttp.Config{IdempotencyKeys: true, Retry: guardrail.Retry{MaxAttempts: 1}})
	_, err := client.Post("http://127.0.0.1:1/orders", "application/json", nil) // nothing listens
	var ke *guardhttp.IdempotencyKeyError
	if errors.As(err, &ke) {
		fmt.Println("resend with Idempotency-Key of", len(ke.Key), "hex digits")
	}

	// An order ID makes the key the same wherever and whenever it is sent.
	req, _ := http.NewRequest("POST", "http://orders.internal/orders", nil)
	req.Header.Set(idempotency.HeaderKey, "order-82")
	fmt.Println(req.Header.Get(idempotency.HeaderKey))
	// Output:
	// resend with Idempotency-Key of 32 hex digits
	// order-82
}
