package fleet_test

import (
	"fmt"

	"github.com/guardrail-go/guardrail/fleet"
)

// A fleet of a known size: each process's share of a limit of 1,000
// requests a second when the shared store is down.
func ExampleFixed() {
	var m fleet.Members = fleet.Fixed(8)
	fmt.Println(1000 / m.Live())
	// Output: 125
}
