package golangci_test

import (
	"fmt"

	"github.com/guardrail-go/guardrail/extra/vet/golangci"
)

// The settings golangci-lint passes from .golangci.yml select the checks.
func ExampleNew() {
	p, err := golangci.New(map[string]any{"checks": []string{"deadline"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	as, err := p.BuildAnalyzers()
	fmt.Println(len(as), as[0].Name, err, p.GetLoadMode())
	// Output: 1 deadline <nil> typesinfo
}
