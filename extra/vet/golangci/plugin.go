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

// settings are the plugin's settings in .golangci.yml.
type settings struct {
	// Checks names the analyzers to run; empty means all of them.
	Checks []string `json:"checks"`
}

// plugin is the golangci-lint plugin New returns. It holds settings only
// and is safe for concurrent use.
type plugin struct {
	settings settings
}

// New decodes the plugin's settings from .golangci.yml (one key, checks:
// the names of the analyzers to run, all of them when empty; any other key
// is an error), checks the names and returns the plugin golangci-lint
// registers as "guardrail". Its BuildAnalyzers returns the analyzers the
// settings select, for drivers that take a plain list too.
func New(conf any) (register.LinterPlugin, error) {
	s, err := register.DecodeSettings[settings](conf)
	if err != nil {
		return nil, err
	}
	if _, err := vet.ByName(s.Checks); err != nil {
		return nil, err
	}
	return &plugin{settings: s}, nil
}

// BuildAnalyzers returns the analyzers the settings select.
func (p *plugin) BuildAnalyzers() ([]*analysis.Analyzer, error) {
	return vet.ByName(p.settings.Checks)
}

// GetLoadMode tells golangci-lint the analyzers need type information.
func (p *plugin) GetLoadMode() string { return register.LoadModeTypesInfo }
