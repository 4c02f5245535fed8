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
// same function; and a go-retryablehttp client sending through a retrying
// guardhttp client. Attempts then multiply: three tiers of three attempts
// send 27 requests to a dependency that is already failing.
var Stacked = &analysis.Analyzer{
	Name:     "stacked",
	Doc:      "report retries on retries: a retrying guardrail.Do around a client that retries itself (guardhttp, go-retryablehttp, AWS SDK default retryer) or around another retrying guardrail.Do",
	URL:      "https://pkg.go.dev/github.com/guardrail-go/guardrail/extra/vet#Stacked",
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
	ins.WithStack([]ast.Node{(*ast.CallExpr)(nil), (*ast.AssignStmt)(nil), (*ast.CompositeLit)(nil)}, func(n ast.Node, push bool, stack []ast.Node) bool {
		if !push {
			return true
		}
		if f, ok := stack[0].(*ast.File); !ok || !files[f] {
			return false
		}
		if as, ok := n.(*ast.AssignStmt); ok {
			stackedAssign(pass, r, vals, as)
			return true
		}
		if lit, ok := n.(*ast.CompositeLit); ok {
			if isNamed(info.TypeOf(lit), pkgRetryable, "Client") {
				if hc, ok := fieldOf(lit, "HTTPClient"); ok {
					n := int64(4)
					if v, ok := fieldOf(lit, "RetryMax"); ok {
						c, isConst := constInt(info, v)
						if !isConst {
							return true
						}
						n = c
					}
					reportRetryableOverGuardhttp(info, r, vals, hc, n+1)
				}
			}
			return true
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

// stackedAssign reports rc.HTTPClient = c, a go-retryablehttp client sending
// through a retrying guardhttp client.
func stackedAssign(pass *analysis.Pass, r *reporter, vals *values, as *ast.AssignStmt) {
	info := pass.TypesInfo
	if len(as.Lhs) != len(as.Rhs) {
		return
	}
	for i, l := range as.Lhs {
		sel, ok := ast.Unparen(l).(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "HTTPClient" || !isNamed(info.TypeOf(sel.X), pkgRetryable, "Client") {
			continue
		}
		n, ok := retryableAttempts(info, vals, sel.X)
		if !ok {
			continue
		}
		reportRetryableOverGuardhttp(info, r, vals, as.Rhs[i], n)
	}
}

func reportRetryableOverGuardhttp(info *types.Info, r *reporter, vals *values, hc ast.Expr, outer int64) {
	if outer <= 1 {
		return
	}
	inner, _, ok := guardhttpRetries(info, vals, hc)
	if !ok || inner <= 1 {
		return
	}
	r.report(hc.Pos(), "go-retryablehttp (%d attempts) sends through a guardhttp client that retries on its own (%d attempts): the attempts multiply to %d; switch one off (RetryMax: 0, or MaxAttempts: 1)", outer, inner, outer*inner)
}
