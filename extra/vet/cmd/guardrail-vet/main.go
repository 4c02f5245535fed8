// Command guardrail-vet runs guardrail's production checklist under go vet:
//
//	go install github.com/guardrail-go/guardrail/extra/vet/cmd/guardrail-vet@latest
//	go vet -vettool=$(which guardrail-vet) ./...
//
// Flags select checks as for go vet's own analyzers: -timeout=false turns
// one off; with -timeout alone only that one runs. It speaks go vet's
// unit protocol, so go vet drives it package by package with the build
// cache.
package main

import (
	"github.com/guardrail-go/guardrail/extra/vet"
	"golang.org/x/tools/go/analysis/unitchecker"
)

func main() { unitchecker.Main(vet.Analyzers()...) }
