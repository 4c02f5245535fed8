package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/guardrail-go/guardrail"
	"github.com/guardrail-go/guardrail/bulkhead"
	"github.com/guardrail-go/guardrail/fleet"
)

// Two processes share a cap of 2 calls at once to a partner API. Here the
// store is in memory; a fleet puts it in Redis (package redissem).
func ExampleSemaphore() {
	store := new(fleet.MemorySemaphoreStore)
	newProcess := func() *fleet.Semaphore {
		sem, err := fleet.NewSemaphore(fleet.SemaphoreConfig{
			Store:   store,
			Name:    "partner-api",
			Limit:   2,
			MaxWait: 10 * time.Millisecond,
		})
		if err != nil {
			panic(err)
		}
		return sem
	}
	a, b := newProcess(), newProcess()
	defer a.Close()
	defer b.Close()

	ctx := context.Background()
	releaseA, _ := a.Acquire(ctx)
	releaseB, _ := b.Acquire(ctx)
	_, err := b.Acquire(ctx) // both slots are taken, by two processes
	fmt.Println("third call:", err, errors.Is(err, bulkhead.ErrFull))
	releaseA()
	releaseB2, err := b.Acquire(ctx)
	fmt.Println("after a release:", err)
	releaseB()
	releaseB2()
	// Output:
	// third call: fleet: semaphore full true
	// after a release: <nil>
}

// A Semaphore backs a Policy's bulkhead: the Bulkhead bounds this
// process, the Semaphore the fleet, and a refusal by either is
// guardrail.ErrBulkheadFull.
func ExampleSemaphore_policy() {
	sem, err := fleet.NewSemaphore(fleet.SemaphoreConfig{
		Store:   new(fleet.MemorySemaphoreStore),
		Name:    "partner-api",
		Limit:   1,
		MaxWait: 10 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	defer sem.Close()
	bh, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 10, MaxQueue: 100, MaxWait: time.Second, Shared: sem})
	if err != nil {
		panic(err)
	}
	policy := &guardrail.Policy{Name: "partner-api", Bulkhead: bh}

	held, _ := sem.Acquire(context.Background()) // another call of the fleet
	_, err = guardrail.Do(context.Background(), policy, func(ctx context.Context) (string, error) {
		return "quote", nil
	})
	fmt.Println(errors.Is(err, guardrail.ErrBulkheadFull), errors.Is(err, fleet.ErrFull))
	held()
	v, err := guardrail.Do(context.Background(), policy, func(ctx context.Context) (string, error) {
		return "quote", nil
	})
	fmt.Println(v, err)
	// Output:
	// true true
	// quote <nil>
}
