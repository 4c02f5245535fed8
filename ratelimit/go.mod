module github.com/guardrail-go/guardrail/ratelimit

go 1.26.0

require (
	github.com/guardrail-go/guardrail v0.0.0-00010101000000-000000000000
	go.uber.org/goleak v1.3.0
	golang.org/x/time v0.16.0
)

replace github.com/guardrail-go/guardrail => ..
