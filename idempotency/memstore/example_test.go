package memstore_test

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/guardrail-go/guardrail/idempotency"
	"github.com/guardrail-go/guardrail/idempotency/memstore"
)

func Example() {
	s, err := memstore.New(memstore.Config{MaxEntries: 10_000, MaxBytes: 16 << 20})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	fp := idempotency.Fingerprint{1}

	first, _ := s.Begin(ctx, "key", fp, 30*time.Second)
	fmt.Println(first.State)
	retry, _ := s.Begin(ctx, "key", fp, 30*time.Second)
	fmt.Println(retry.State)

	s.Complete(ctx, "key", first.Token, &idempotency.Response{Status: http.StatusCreated, Body: []byte("ok")}, time.Hour)
	done, _ := s.Begin(ctx, "key", fp, 30*time.Second)
	fmt.Println(done.State, done.Response.Status, string(done.Response.Body))

	_, err = memstore.New(memstore.Config{MaxEntries: -1})
	fmt.Println(err)
	// Output:
	// acquired
	// in_flight
	// completed 201 ok
	// memstore: Config.MaxEntries is -1; want a positive count, or 0 for 100000
}
