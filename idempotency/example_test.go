package idempotency_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
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

	store, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	keys, err := idempotency.New(store, idempotency.Config{
		Name:     "payments",
		Required: true,
		// Keys are the caller's own: in a real service, the account of
		// the authenticated request.
		Scope: func(r *http.Request) (string, error) {
			if a := r.Header.Get("X-Account"); a != "" {
				return a, nil
			}
			return "", errors.New("no account")
		},
	})
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", keys.Middleware(pay))

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

// New refuses a Config that does not say whose keys are whose.
func ExampleNew() {
	store, _ := memstore.New(memstore.Config{})
	_, err := idempotency.New(store, idempotency.Config{})
	fmt.Println(errors.Is(err, idempotency.ErrInvalidConfig))

	// One trusted caller: say so.
	_, err = idempotency.New(store, idempotency.Config{SingleTenant: true})
	fmt.Println(err)
	// Output:
	// true
	// <nil>
}

// A handler confirms that it still holds its key right before the side
// effect, and commits only then. When it cannot, it answers 503 without
// committing: that releases the key if it is still the request's, and the
// client's retry with the same key runs the handler again. A request
// without a key needs no special case: Confirm returns nil for it.
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
	store, _ := memstore.New(memstore.Config{})
	keys, err := idempotency.New(store, idempotency.Config{SingleTenant: true})
	if err != nil {
		panic(err)
	}
	h := keys.Middleware(pay)

	for _, key := range []string{"pay-o1-8e03978e", "pay-o1-8e03978e", ""} { // the request, its retry, one without a key
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":4200}`))
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Body)
	}
	// Outside the middleware there is nothing to confirm.
	fmt.Println(idempotency.Confirm(context.Background()))
	// Output:
	// 201 charge 1
	// 201 charge 1
	// 201 charge 2
	// idempotency: no lease in context
}

// A handler that panics may have committed, so its retry is not run: it
// gets a replayed 500 saying the outcome is unknown. A handler that knows
// it committed nothing calls Release first, and its retry runs.
func ExampleRelease() {
	charges := 0
	pay := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Attempt") == "1" {
			if r.URL.Query().Has("before-charge") {
				idempotency.Release(r.Context()) // nothing happened yet
			} else {
				charges++
			}
			panic("bug")
		}
		charges++
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, "charge %d", charges)
	})
	store, _ := memstore.New(memstore.Config{})
	keys, _ := idempotency.New(store, idempotency.Config{SingleTenant: true})
	h := keys.Middleware(pay)

	send := func(url, key, attempt string) {
		defer func() {
			if v := recover(); v != nil {
				fmt.Println("attempt", attempt, "panicked:", v)
			}
		}()
		req := httptest.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":4200}`))
		req.Header.Set("Idempotency-Key", key)
		req.Header.Set("X-Attempt", attempt)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println("attempt", attempt, rec.Code, "replayed="+rec.Header().Get("Idempotent-Replayed"))
	}
	send("/payments", "k1", "1")
	send("/payments", "k1", "2")
	send("/payments?before-charge", "k2", "1")
	send("/payments?before-charge", "k2", "2")
	fmt.Println("charges:", charges)
	// Output:
	// attempt 1 panicked: bug
	// attempt 2 500 replayed=true
	// attempt 1 panicked: bug
	// attempt 2 201 replayed=
	// charges: 2
}

// Keys is the protocol under the HTTP middleware, for a transport of your
// own: here, a queue consumer whose messages carry an idempotency key and
// may be delivered more than once. Each delivery maps to a Request; the
// consumer's answer maps to a stored Response, whose status class says
// whether it is kept (201) or releases the key so that a redelivery runs
// again (429: the downstream rate limit refused it).
func ExampleKeys() {
	store, err := memstore.New(memstore.Config{})
	if err != nil {
		panic(err)
	}
	keys, err := idempotency.NewKeys(store, idempotency.KeysConfig{Name: "orders"})
	if err != nil {
		panic(err)
	}
	runs, limited := 0, true
	consume := func(ctx context.Context, tenant, key, payload string) string {
		res, sess, err := keys.Begin(ctx, idempotency.Request{
			Scope:       []string{tenant, "orders.place"},
			Key:         key,
			Fingerprint: sha256.Sum256([]byte(payload)),
			Operation:   "orders.place",
		})
		switch {
		case err != nil:
			return "store down: redeliver later"
		case res.State == idempotency.StateCompleted:
			return "replayed " + string(res.Response.Body)
		case res.State == idempotency.StateInFlight:
			return "in flight: redeliver later"
		case res.State == idempotency.StateMismatch:
			return "key reused for another payload"
		}
		// StateAcquired: run under the session's context, in which Held,
		// Confirm and Release work. Confirm before the side effect.
		if err := idempotency.Confirm(sess.Context()); err != nil {
			sess.Release("lease lost before placing the order")
			return "lease lost: redeliver later"
		}
		runs++
		if limited {
			limited = false
			sess.Complete(&idempotency.Response{Status: http.StatusTooManyRequests})
			return "rate limited"
		}
		body := fmt.Sprintf("order %d", runs)
		sess.Complete(&idempotency.Response{Status: http.StatusCreated, Body: []byte(body)})
		return "placed " + body
	}
	ctx := context.Background()
	fmt.Println(consume(ctx, "acct_1", "m-1", `{"sku":"a"}`))
	fmt.Println(consume(ctx, "acct_1", "m-1", `{"sku":"a"}`))
	fmt.Println(consume(ctx, "acct_1", "m-1", `{"sku":"a"}`))
	fmt.Println(consume(ctx, "acct_1", "m-1", `{"sku":"b"}`))
	fmt.Println("runs:", runs)
	// Output:
	// rate limited
	// placed order 2
	// replayed order 2
	// key reused for another payload
	// runs: 2
}
