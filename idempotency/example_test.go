package idempotency_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

func Example() {
	charges := 0
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		charges++ // the side effect
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", charges)
	})

	guard := idempotency.Middleware(memstore.New(memstore.Config{}), idempotency.Config{
		Required:  true,
		Principal: func(r *http.Request) string { return r.Header.Get("X-Account") },
	})
	mux := http.NewServeMux()
	mux.Handle("POST /payments", guard(pay))

	post := func(key, payload string) {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(payload))
		req.Header.Set("X-Account", "acct_1")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, req)
		body := rec.Body.String()
		if rec.Header().Get("Content-Type") == "application/problem+json" {
			var p struct{ Title string }
			json.Unmarshal(rec.Body.Bytes(), &p)
			body = p.Title
		}
		fmt.Printf("%d replayed=%q %s\n", rec.Code, rec.Header().Get("Idempotent-Replayed"), body)
	}
	post(`"pay-o1-8e03978e"`, `{"amount":4200}`) // first: runs
	post(`"pay-o1-8e03978e"`, `{"amount":4200}`) // retry: replayed
	post(`"pay-o1-8e03978e"`, `{"amount":9900}`) // key reused for another payload
	post("", `{"amount":4200}`)                  // no key
	fmt.Println("charges:", charges)
	// Output:
	// 201 replayed="" charge 1
	// 201 replayed="true" charge 1
	// 422 replayed="" Idempotency-Key is already used
	// 400 replayed="" Idempotency-Key is missing
	// charges: 1
}

// A handler confirms that it still holds its key right before the side
// effect, and commits only then. When it cannot, it answers 503 without
// committing: that releases the key if it is still the request's, and the
// client's retry with the same key runs the handler again.
func ExampleConfirm() {
	charges := 0
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Validate the payment, look the account up: work a retry may
		// safely do again.
		if err := idempotency.Confirm(r.Context()); err != nil {
			w.Header().Set("Retry-After", "1")
			http.Error(w, "payment not made, retry", http.StatusServiceUnavailable)
			return
		}
		charges++ // the side effect, well within a lease of Confirm
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", charges)
	})
	h := idempotency.Middleware(memstore.New(memstore.Config{}), idempotency.Config{})(pay)

	for range 2 { // the request, then its retry
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":4200}`))
		req.Header.Set("Idempotency-Key", "pay-o1-8e03978e")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Body)
	}
	// Outside a request the middleware runs under a lease there is
	// nothing to confirm.
	fmt.Println(idempotency.Confirm(context.Background()))
	// Output:
	// 201 charge 1
	// 201 charge 1
	// idempotency: no lease in context
}
