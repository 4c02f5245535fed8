package budget_test

import (
	"fmt"

	"github.com/guardrail-go/guardrail/budget"
	"github.com/guardrail-go/guardrail/fleet"
)

func Example() {
	b, err := budget.New(budget.Config{Ratio: 0.1, Max: 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	granted := 0
	for range 1000 { // a dependency that is down: every call wants 3 retries
		b.Deposit()
		for range 3 {
			if !b.TryRetry() {
				break
			}
			granted++
		}
	}
	fmt.Printf("1000 calls, %d retries\n", granted)
	// Output: 1000 calls, 109 retries
}

// A fleet of 4 processes shares a burst of 20 retries: each process
// starts with its share, 5 tokens, instead of 10 of its own.
func Example_fleet() {
	b, err := budget.New(budget.Config{Members: fleet.Fixed(4), FleetMax: 20})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(b.Max())
	// Output: 5
}
