module github.com/guardrail-go/guardrail/config

go 1.26.0

require (
	github.com/guardrail-go/guardrail v0.0.0-00010101000000-000000000000
	github.com/guardrail-go/guardrail/ratelimit v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.5
)

require golang.org/x/time v0.16.0 // indirect

replace github.com/guardrail-go/guardrail => ..

replace github.com/guardrail-go/guardrail/ratelimit => ../ratelimit
