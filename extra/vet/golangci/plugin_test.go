package golangci_test

import (
	"testing"

	"github.com/golangci/plugin-module-register/register"
	"github.com/guardrail-go/guardrail/extra/vet/golangci"
)

func TestRegistered(t *testing.T) {
	newPlugin, err := register.GetPlugin("guardrail")
	if err != nil {
		t.Fatal(err)
	}
	p, err := newPlugin(map[string]any{"checks": []string{"timeout", "stacked"}})
	if err != nil {
		t.Fatal(err)
	}
	as, err := p.BuildAnalyzers()
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 2 || as[0].Name != "timeout" || as[1].Name != "stacked" {
		t.Fatalf("analyzers = %v; want timeout, stacked", as)
	}
	if p.GetLoadMode() != register.LoadModeTypesInfo {
		t.Fatalf("load mode = %q", p.GetLoadMode())
	}
}

func TestAllByDefault(t *testing.T) {
	p, err := golangci.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	as, err := p.BuildAnalyzers()
	if err != nil {
		t.Fatal(err)
	}
	if len(as) != 6 {
		t.Fatalf("got %d analyzers; want 6", len(as))
	}
}

func TestBadSettings(t *testing.T) {
	if _, err := golangci.New(map[string]any{"checks": []string{"nope"}}); err == nil {
		t.Fatal("unknown check accepted")
	}
	if _, err := golangci.New(map[string]any{"check": []string{"timeout"}}); err == nil {
		t.Fatal("unknown setting accepted")
	}
}
