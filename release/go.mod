module github.com/guardrail-go/guardrail/release

go 1.26.0

require golang.org/x/mod v0.42.0
