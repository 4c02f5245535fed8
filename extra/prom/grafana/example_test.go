package grafana_test

import (
	"encoding/json"
	"fmt"

	"github.com/guardrail-go/guardrail/extra/prom/grafana"
)

func ExampleDashboard() {
	var d struct {
		Title  string `json:"title"`
		Panels []struct {
			Type  string `json:"type"`
			Title string `json:"title"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(grafana.Dashboard(), &d); err != nil {
		panic(err)
	}
	fmt.Println(d.Title)
	for _, p := range d.Panels {
		if p.Type == "row" {
			fmt.Println("-", p.Title)
		}
	}
	// Output:
	// guardrail
	// - Calls and retries
	// - Latency, deadlines and timeouts
	// - Breakers and bulkheads
	// - Server: shedding and idempotency
}
