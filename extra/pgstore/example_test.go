package pgstore_test

import (
	"context"
	"errors"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/guardrail-go/guardrail/extra/pgstore"
	"github.com/guardrail-go/guardrail/idempotency"
)

// Every instance of the service points at the same database; one of them
// (or a cron job) sweeps expired rows.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, "postgres://app@127.0.0.1:5432/app")
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store, err := pgstore.New(pool, pgstore.Config{Table: "idempotency_keys"})
	if err != nil {
		log.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	go func() {
		for range time.Tick(5 * time.Minute) {
			if _, err := store.Sweep(ctx); err != nil {
				log.Print(err)
			}
		}
	}()

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
