// Package grafana holds guardrail's Grafana dashboard, built only from the
// series documented in docs/metrics.md.
package grafana

import _ "embed"

//go:embed guardrail.json
var dashboard []byte

// Dashboard returns the dashboard's JSON, ready to import into Grafana or to
// provision from a file. Its "datasource" variable picks the Prometheus data
// source, its "dependency" variable the dependencies shown. Each call
// returns a new copy.
func Dashboard() []byte {
	return append([]byte(nil), dashboard...)
}
