package vet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Stacked reports retries on retries: guardrail.Do (or DoCall) with a
// Policy that retries, around a call through a client that retries on its
// own (a guardhttp client, go-retryablehttp, an AWS SDK client built with
// its default retryer), or around another retrying guardrail.Do in the
// same function. Attempts then multiply: three tiers of three attempts
// send 27 requests to a dependency that is already failing.
var Stacked = &analysis.Analyzer{
	Name:     "stacked",
	Doc:      "report retries on retries: a retrying guardrail.Do around a client that retries itself (guardhttp, go-retryablehttp, AWS SDK default retryer) or around another retrying guardrail.Do",
	URL:      "https://pkg.go.dev/github.com/guardrail-go/guardrail/vet#Stacked",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      runStacked,
}

func runStacked(pass *analysis.Pass) (any, error) {
	r := newReporter(pass)
	vals := newValues(pass)
	info := pass.TypesInfo
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	files := map[*ast.File]bool{}
	for _, f := range pass.Files {
		files[f] = !skipFile(pass, f)
	}
	ins.WithStack([]ast.Node{(*ast.CallExpr)(nil)}, func(n ast.Node, push bool, stack []ast.Node) bool {
		if !push {
			return true
		}
		if f, ok := stack[0].(*ast.File); !ok || !files[f] {
			return false
		}
		call := n.(*ast.CallExpr)
		outer, ok := guardrailDo(info, vals, call)
		if !ok || outer <= 1 {
			return true
		}
		op, ok := ast.Unparen(call.Args[len(call.Args)-1]).(*ast.FuncLit)
		if !ok {
			return true
		}
		ast.Inspect(op.Body, func(m ast.Node) bool {
			c, ok := m.(*ast.CallExpr)
			if !ok {
				_, lit := m.(*ast.FuncLit)
				return !lit
			}
			if inner, ok := guardrailDo(info, vals, c); ok && inner > 1 {
				r.report(c.Pos(), "guardrail.Do inside guardrail.Do, both retrying (%d and %d attempts): the attempts multiply to %d; keep retries at one tier (MaxAttempts: 1 on one of them)", outer, inner, outer*inner)
				return false
			}
			if what, inner, ok := selfRetrying(info, vals, c); ok {
				r.report(c.Pos(), "guardrail.Do retries (%d attempts) around %s, which retries on its own (%d attempts): the attempts multiply to %d; keep retries at one tier (MaxAttempts: 1 on one side)", outer, what, inner, outer*inner)
			}
			return true
		})
		return true
	})
	return nil, nil
}

// guardrailDo returns the attempts of a guardrail.Do or DoCall call's
// policy, when call is one and its policy can be traced.
func guardrailDo(info *types.Info, vals *values, call *ast.CallExpr) (int64, bool) {
	fn := callee(info, call)
	if !isFunc(fn, pkgGuardrail, "Do", "DoCall") || len(call.Args) < 3 {
		return 0, false
	}
	return policyAttempts(info, vals, call.Args[1])
}
