package vet_test

import (
	"strings"
	"testing"

	"github.com/guardrail-go/guardrail/extra/vet"
)

func TestByName(t *testing.T) {
	as, err := vet.ByName([]string{"stacked", "timeout"})
	if err != nil || len(as) != 2 || as[0].Name != "timeout" || as[1].Name != "stacked" {
		t.Fatalf("ByName = %v, %v; want timeout, stacked in Analyzers order", as, err)
	}
	if _, err := vet.ByName([]string{"tiemout"}); err == nil || !strings.Contains(err.Error(), `"tiemout"`) {
		t.Fatalf("ByName(tiemout) error = %v", err)
	}
}
