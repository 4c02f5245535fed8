package golangci_test

import (
	"fmt"

	"github.com/guardrail-go/guardrail/extra/vet/golangci"
)

// The settings golangci-lint passes from .golangci.yml select the checks.
func ExampleAnalyzers() {
	as, err := golangci.Analyzers(map[string]any{"checks": []string{"deadline"}})
	fmt.Println(len(as), as[0].Name, err)
	// Output: 1 deadline <nil>
}
