module github.com/guardrail-go/guardrail

go 1.26
