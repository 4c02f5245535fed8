// Package golangci registers guardrail's checklist as a golangci-lint
// module plugin named "guardrail".
//
// Build a golangci-lint that includes it with golangci-lint custom and a
// .custom-gcl.yml naming this module, then enable the linter in
// .golangci.yml:
//
//	linters:
//	  enable:
//	    - guardrail
//	  settings:
//	    custom:
//	      guardrail:
//	        type: module
//	        settings:
//	          checks: [timeout, deadline, retryloop, stacked, idempotency, tiers]
//
// Leaving checks out runs them all.
package golangci

import (
	"github.com/golangci/plugin-module-register/register"
	"github.com/guardrail-go/guardrail/extra/vet"
	"golang.org/x/tools/go/analysis"
)

// name is the linter's name in golangci-lint's configuration.
const name = "guardrail"

func init() { register.Plugin(name, New) }

// Settings are the plugin's settings in .golangci.yml.
type Settings struct {
	// Checks names the analyzers to run; empty means all of them.
	Checks []string `json:"checks"`
}

// plugin is the golangci-lint plugin New returns. It holds settings only
// and is safe for concurrent use.
type plugin struct {
	settings Settings
}

// New decodes the plugin's settings (unknown keys are an error), checks the
// names they hold and returns the plugin golangci-lint registers as
// "guardrail".
func New(conf any) (register.LinterPlugin, error) {
	s, err := register.DecodeSettings[Settings](conf)
	if err != nil {
		return nil, err
	}
	if _, err := vet.ByName(s.Checks); err != nil {
		return nil, err
	}
	return &plugin{settings: s}, nil
}

// Analyzers returns the analyzers conf selects, for drivers that take a
// plain list: New(conf) followed by BuildAnalyzers.
func Analyzers(conf any) ([]*analysis.Analyzer, error) {
	p, err := New(conf)
	if err != nil {
		return nil, err
	}
	return p.BuildAnalyzers()
}

// BuildAnalyzers returns the analyzers the settings select.
func (p *plugin) BuildAnalyzers() ([]*analysis.Analyzer, error) {
	return vet.ByName(p.settings.Checks)
}

// GetLoadMode tells golangci-lint the analyzers need type information.
func (p *plugin) GetLoadMode() string { return register.LoadModeTypesInfo }
