package redisstore_test

import (
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/redisstore"
)

// Every instance of the service points at the same Redis, so a retry that
// lands on another instance still gets the stored response.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store := redisstore.New(client, redisstore.Config{Prefix: "payments:idem:"})

	mux := http.NewServeMux()
	mux.Handle("POST /payments", idempotency.Middleware(store, idempotency.Config{
		Required:  true,
		Principal: func(r *http.Request) string { return r.Header.Get("X-Account") },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	_ = http.ListenAndServe // serve mux as usual
}
