module github.com/guardrail-go/guardrail/extra/ratelimit

go 1.26.0

require (
	github.com/guardrail-go/guardrail v0.1.0
	go.uber.org/goleak v1.3.0
	golang.org/x/time v0.16.0
)
