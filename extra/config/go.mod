module github.com/guardrail-go/guardrail/extra/config

go 1.26.0

require (
	github.com/guardrail-go/guardrail v0.1.0
	github.com/guardrail-go/guardrail/extra/ratelimit v0.1.0
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.5
)

require golang.org/x/time v0.16.0 // indirect
