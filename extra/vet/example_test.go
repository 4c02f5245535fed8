package vet_test

import (
	"fmt"

	"github.com/guardrail-go/guardrail/extra/vet"
)

// The checks, by the names a suppression comment and -checks use.
func ExampleAnalyzers() {
	for _, a := range vet.Analyzers() {
		fmt.Println(a.Name)
	}
	// Output:
	// timeout
	// deadline
	// retryloop
	// stacked
	// idempotency
	// tiers
}

// Selecting checks by name, as the guardrail command's -checks flag does.
func ExampleByName() {
	as, err := vet.ByName([]string{"retryloop", "timeout"})
	fmt.Println(len(as), as[0].Name, as[1].Name, err)
	_, err = vet.ByName([]string{"timeouts"})
	fmt.Println(err)
	// Output:
	// 2 timeout retryloop <nil>
	// vet: unknown check "timeouts"; want timeout, deadline, retryloop, stacked, idempotency or tiers
}
