package pgstore_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/pgstore"
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
	store := pgstore.New(pool, pgstore.Config{Table: "idempotency_keys"})
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

	mux := http.NewServeMux()
	mux.Handle("POST /payments", idempotency.Middleware(store, idempotency.Config{
		Required:  true,
		Principal: func(r *http.Request) string { return r.Header.Get("X-Account") },
	})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	_ = http.ListenAndServe // serve mux as usual
}
