package bulkhead_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/guardrail-go/guardrail/bulkhead"
)

func Example() {
	// Two calls to the recommendation service at a time, no waiting: a
	// third caller is refused at once instead of piling up.
	b, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	ctx := context.Background()

	first, _ := b.Acquire(ctx)
	second, _ := b.Acquire(ctx)
	if _, err := b.Acquire(ctx); err != nil {
		fmt.Println("third call:", err, "- in flight:", b.InFlight())
	}
	first.Release()
	second.Release()
	second.Release() // a second Release does nothing
	fmt.Println("in flight:", b.InFlight())
	// Output:
	// third call: bulkhead: full - in flight: 2
	// in flight: 0
}

func Example_deadline() {
	// One call at a time; up to 10 callers wait, each at most 1 s and never
	// past its own deadline.
	b, err := bulkhead.New(bulkhead.Config{MaxConcurrent: 1, MaxQueue: 10, MaxWait: time.Second})
	if err != nil {
		fmt.Println(err)
		return
	}
	slot, _ := b.Acquire(context.Background())
	defer slot.Release()

	// This caller has 20 ms left: it gives up then, not after MaxWait, and
	// leaves the queue as it found it.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	_, err = b.Acquire(ctx)
	fmt.Println(err, "- waiting:", b.Waiting())
	// Output:
	// context deadline exceeded - waiting: 0
}

// One compartment per host: a slow host fills its own, not the others'.
func ExampleGroup() {
	g, err := bulkhead.NewGroup(bulkhead.GroupConfig{Config: bulkhead.Config{MaxConcurrent: 1}})
	if err != nil {
		panic(err)
	}
	slow, _ := g.Get("slow.internal").Acquire(context.Background())
	_, errSlow := g.Get("slow.internal").AcquireBy(context.Background(), time.Now())
	fast, errFast := g.Get("fast.internal").Acquire(context.Background())
	fmt.Println(errors.Is(errSlow, bulkhead.ErrFull), errFast)
	fast.Release()
	slow.Release()
	// Output: true <nil>
}
