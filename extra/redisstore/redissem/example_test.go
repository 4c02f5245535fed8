package redissem_test

import (
	"context"
	"log"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/extra/redisstore/redissem"
	"github.com/guardrail-go/guardrail/fleet"
	"github.com/guardrail-go/guardrail/guardhttp"
)

// A partner API allows 50 calls at once from the whole company. Every
// instance of every service that calls it shares one semaphore in Redis,
// behind the bulkhead of its HTTP client.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	store, err := redissem.New(client, redissem.Config{})
	if err != nil {
		log.Fatal(err)
	}
	sem, err := fleet.NewSemaphore(fleet.SemaphoreConfig{
		Store:          store,
		Name:           "partner-api",
		Limit:          50,
		LeaseTTL:       10 * time.Second, // a crashed instance's slots come back within 10 s
		OnStoreFailure: fleet.FailOpen,   // Redis down: this instance's share, 50 / 5
		Members:        fleet.Fixed(5),
	})
	if err != nil {
		log.Fatal(err)
	}
	defer sem.Close()

	transport, err := guardhttp.NewTransport(nil, guardhttp.Config{
		Bulkhead: &bulkhead.Config{MaxConcurrent: 50, MaxWait: 2 * time.Second, Shared: sem},
	})
	if err != nil {
		log.Fatal(err)
	}
	partner := &http.Client{Transport: transport}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://partner.example/v1/quote", nil)
	if resp, err := partner.Do(req); err == nil {
		resp.Body.Close()
	}
}
