package redisfleet_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/guardrail-go/guardrail/extra/redisstore/redisfleet"
	"github.com/guardrail-go/guardrail/fleet"
)

// Every process of the service points at the same Redis: together they
// admit 1,000 requests a second per tenant, and each spends leased tokens
// without a round trip for most requests.
func Example() {
	client := redis.NewClient(&redis.Options{
		Addr:                  "127.0.0.1:6379",
		ContextTimeoutEnabled: true, // a call ends at the limiter's StoreTimeout
	})
	defer client.Close()
	store, err := redisfleet.New(client, redisfleet.Config{Prefix: "api:limit:"})
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := fleet.NewLimiter(fleet.LimiterConfig{
		Store:          store,
		Rate:           1000,
		OnStoreFailure: fleet.FailOpen,
		Members:        fleet.Fixed(8), // while Redis is down, each of 8 processes admits 125/s
	})
	if err != nil {
		log.Fatal(err)
	}
	defer limiter.Close() // gives back the unspent leases

	handle := func(ctx context.Context, tenant string) error {
		if err := limiter.Allow(ctx, tenant); err != nil {
			var limited *fleet.LimitedError
			if errors.As(err, &limited) {
				return fmt.Errorf("busy, retry in %v: %w", limited.RetryAfter, err)
			}
			return err
		}
		return nil // serve the request
	}
	_ = handle
}

// New checks that every call can end at the limiter's deadline: a client
// that would wait for its own read timeout (3 s by default) is refused.
func ExampleNew() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	defer client.Close()
	_, err := redisfleet.New(client, redisfleet.Config{})
	fmt.Println(errors.Is(err, redisfleet.ErrInvalidConfig))

	client2 := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", ContextTimeoutEnabled: true, ReadTimeout: time.Second})
	defer client2.Close()
	store, err := redisfleet.New(client2, redisfleet.Config{})
	fmt.Println(store.Key("tenant-42"), err)
	// Output:
	// true
	// guardrail:fleet:{tenant-42} <nil>
}
