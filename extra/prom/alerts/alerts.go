// Package alerts holds guardrail's Prometheus recording and alerting rules,
// built only from the series documented in docs/metrics.md.
package alerts

import _ "embed"

//go:embed guardrail.rules.yml
var rules []byte

// Rules returns the rules file, ready for Prometheus's rule_files or for
// a PrometheusRule object. Each alert names in its annotations the panel
// of the guardrail dashboard (package grafana) that shows what it fires
// on (dashboard_panel, for a link such as /d/guardrail?viewPanel=5) and
// the section of docs/metrics.md that says what to do (runbook). Each
// call returns a new copy.
func Rules() []byte {
	return append([]byte(nil), rules...)
}
