module github.com/guardrail-go/guardrail

go 1.26

require (
	go.uber.org/goleak v1.3.0
	go.yaml.in/yaml/v3 v3.0.6
)
