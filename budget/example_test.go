package budget_test

import (
	"fmt"

	"github.com/guardrail-go/guardrail/budget"
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
