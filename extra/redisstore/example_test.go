package redisstore_test

import (
	"errors"
	"log"
	"net/http"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/extra/redisstore"
	"github.com/guardrail-go/guardrail/idempotency"
)

// Every instance of the service points at the same Redis, so a retry that
// lands on another instance still gets the stored response.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, err := redisstore.New(client, redisstore.Config{Prefix: "payments:idem:"})
	if err != nil {
		log.Fatal(err)
	}

	keys, err := idempotency.New(store, idempotency.Config{
		Name:     "payments",
		Required: true,
		Scope:    accountOf, // keys are per account
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /payments", keys.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	_ = http.ListenAndServe // serve mux as usual
}

// accountOf returns the authenticated account of r; here, a header an
// authenticating proxy sets.
func accountOf(r *http.Request) (string, error) {
	if a := r.Header.Get("X-Account"); a != "" {
		return a, nil
	}
	return "", errors.New("no account")
}
