package vet

import (
	"go/ast"
	"go/types"
	"time"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Tiers reports a lower tier given a longer timeout than its caller, where
// both are constants in one function: context.WithTimeout under a context
// that has less time; a guardrail Policy.AttemptTimeout longer than its
// context's; inside guardrail.Do, a client whose Timeout (or guardhttp
// Config.AttemptTimeout) is longer than the Policy's AttemptTimeout. The
// longer bound never applies, and whoever set it planned for time the
// call does not have.
var Tiers = &analysis.Analyzer{
	Name:     "tiers",
	Doc:      "report a lower tier with a longer timeout than its caller: a context.WithTimeout, Policy.AttemptTimeout or client Timeout longer than the bound around it",
	URL:      "https://pkg.go.dev/github.com/guardrail-go/guardrail/extra/vet#Tiers",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      runTiers,
}

func runTiers(pass *analysis.Pass) (any, error) {
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
		fn := callee(info, call)
		switch {
		case isFunc(fn, "context", "WithTimeout", "WithTimeoutCause") && len(call.Args) >= 2:
			d, ok := constInt(info, call.Args[1])
			if !ok {
				return true
			}
			if outer, ok := ctxBudget(info, vals, call.Args[0], 0); ok && d > outer {
				r.report(call.Pos(), "context.WithTimeout of %v under a context with at most %v: the longer timeout never applies, and the callee was promised time it does not have", time.Duration(d), time.Duration(outer))
			}
		case isFunc(fn, pkgGuardrail, "Do", "DoCall") && len(call.Args) >= 3:
			a, ok := policyDuration(info, vals, call.Args[1], "AttemptTimeout")
			if !ok || a <= 0 {
				return true
			}
			if outer, ok := ctxBudget(info, vals, call.Args[0], 0); ok && a > outer {
				r.report(call.Args[1].Pos(), "Policy.AttemptTimeout %v is longer than the %v its context has: the attempt bound never applies", time.Duration(a), time.Duration(outer))
			}
			op, ok := ast.Unparen(call.Args[len(call.Args)-1]).(*ast.FuncLit)
			if !ok {
				return true
			}
			ast.Inspect(op.Body, func(m ast.Node) bool {
				c, ok := m.(*ast.CallExpr)
				if !ok {
					return true
				}
				f := callee(info, c)
				if !isMethod(f, "net/http", "Client", "Do", "Get", "Head", "Post", "PostForm") {
					return true
				}
				if t, what, ok := clientTimeout(info, vals, receiver(c)); ok && t > a {
					r.report(c.Pos(), "%s %v is longer than the Policy's AttemptTimeout %v around it: the lower tier's timeout never applies", what, time.Duration(t), time.Duration(a))
				}
				return true
			})
		}
		return true
	})
	return nil, nil
}

// ctxBudget returns the most time a context expression can have, when it
// was made in this package by context.WithTimeout with a constant, directly
// or through its parents.
func ctxBudget(info *types.Info, vals *values, e ast.Expr, depth int) (int64, bool) {
	if depth > 6 {
		return 0, false
	}
	outs, ok := vals.origins(e)
	if !ok || len(outs) != 1 {
		return 0, false
	}
	c, isCall := outs[0].expr.(*ast.CallExpr)
	if !isCall || outs[0].idx > 0 {
		return 0, false
	}
	fn := callee(info, c)
	if !isFunc(fn, "context", "WithTimeout", "WithTimeoutCause", "WithCancel", "WithValue", "WithCancelCause") || len(c.Args) == 0 {
		return 0, false
	}
	parent, pok := ctxBudget(info, vals, c.Args[0], depth+1)
	if fn.Name() == "WithTimeout" || fn.Name() == "WithTimeoutCause" {
		d, ok := constInt(info, c.Args[1])
		if !ok {
			return parent, pok
		}
		if pok && parent < d {
			return parent, true
		}
		return d, true
	}
	return parent, pok
}

// policyDuration returns a constant duration field of a Policy expression
// that every traced value agrees on.
func policyDuration(info *types.Info, vals *values, e ast.Expr, field string) (int64, bool) {
	fv, ok := vals.field(e, pkgGuardrail, "Policy", field)
	if !ok || len(fv) != 1 || fv[0] == nil {
		return 0, false
	}
	return constInt(info, fv[0])
}

// clientTimeout returns the constant bound of an *http.Client expression:
// its Timeout, or its guardhttp Config.AttemptTimeout.
func clientTimeout(info *types.Info, vals *values, e ast.Expr) (int64, string, bool) {
	if fv, ok := vals.field(e, "net/http", "Client", "Timeout"); ok && len(fv) == 1 && fv[0] != nil {
		if t, ok := constInt(info, fv[0]); ok {
			return t, "http.Client.Timeout", true
		}
	}
	cfgs, ok := guardhttpConfigs(info, vals, e)
	if !ok || len(cfgs) != 1 {
		return 0, "", false
	}
	fv, ok := vals.field(cfgs[0], pkgGuardhttp, "Config", "AttemptTimeout")
	if !ok || len(fv) != 1 || fv[0] == nil {
		return 0, "", false
	}
	t, ok := constInt(info, fv[0])
	return t, "guardhttp Config.AttemptTimeout", ok
}
