package vet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Deadline reports context.Background() and context.TODO() that reach an
// outbound call in a function that has the caller's context at hand (a
// context.Context or *http.Request parameter, an http handler): the call
// then outlives its caller's deadline and cancellation. Work started with
// go or defer is left alone: it outlives the caller on purpose.
var Deadline = &analysis.Analyzer{
	Name:     "deadline",
	Doc:      "report context.Background() or context.TODO() used for an outbound call where the caller's ctx or *http.Request is at hand, which drops the caller's deadline",
	URL:      "https://pkg.go.dev/github.com/guardrail-go/guardrail/extra/vet#Deadline",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      runDeadline,
}

// deriving are the context functions whose result carries their parent.
var deriving = []string{"WithTimeout", "WithDeadline", "WithCancel", "WithValue", "WithCancelCause", "WithTimeoutCause", "WithDeadlineCause"}

func runDeadline(pass *analysis.Pass) (any, error) {
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
		if !isFunc(fn, "context", "Background", "TODO") {
			return true
		}
		cp, ok := callerContext(info, stack)
		if !ok {
			return true
		}
		body := enclosingBody(stack)
		if body == nil {
			return true
		}
		if what, ok := reachesOutbound(info, vals, body, call, stack, 0); ok {
			where := "the function has " + cp.name
			if cp.handler {
				where = "the handler has " + cp.name
			}
			r.report(call.Pos(), "context.%s() drops the caller's deadline and cancellation for %s (%s): derive the call's context from it", fn.Name(), what, where)
		}
		return true
	})
	return nil, nil
}

// reachesOutbound reports whether the context expression e (whose
// ancestors are stack) is the context of an outbound call, directly, through
// context.With*, or through a variable that holds nothing else.
func reachesOutbound(info *types.Info, vals *values, body *ast.BlockStmt, e ast.Expr, stack []ast.Node, depth int) (string, bool) {
	if depth > 4 || len(stack) < 2 {
		return "", false
	}
	switch p := stack[len(stack)-2].(type) {
	case *ast.ParenExpr:
		return reachesOutbound(info, vals, body, p, stack[:len(stack)-1], depth)
	case *ast.CallExpr:
		if arg, what, ok := contextArg(info, p); ok && arg == e {
			return what, true
		}
		if fn := callee(info, p); isFunc(fn, "context", deriving...) && len(p.Args) > 0 && p.Args[0] == e {
			return reachesOutbound(info, vals, body, p, stack[:len(stack)-1], depth+1)
		}
	case *ast.AssignStmt:
		for i, rhs := range p.Rhs {
			if rhs != e || i >= len(p.Lhs) {
				continue
			}
			if len(p.Rhs) == 1 && len(p.Lhs) > 1 {
				i = 0 // ctx, cancel := context.WithTimeout(...)
			}
			return varReachesOutbound(info, vals, body, objOf(info, p.Lhs[i]), depth)
		}
	case *ast.ValueSpec:
		for i, v := range p.Values {
			if v == e && i < len(p.Names) {
				return varReachesOutbound(info, vals, body, info.Defs[p.Names[i]], depth)
			}
		}
		if len(p.Values) == 1 && p.Values[0] == e && len(p.Names) > 1 {
			return varReachesOutbound(info, vals, body, info.Defs[p.Names[0]], depth)
		}
	}
	return "", false
}

// varReachesOutbound reports whether the context variable obj, assigned
// once, is used as the context of an outbound call in body.
func varReachesOutbound(info *types.Info, vals *values, body *ast.BlockStmt, obj types.Object, depth int) (string, bool) {
	if obj == nil || len(vals.of[obj]) != 1 || !isContext(obj.Type()) || isParam(info, obj) {
		// A parameter given Background is a nil guard
		// (if ctx == nil { ctx = context.Background() }): no caller's
		// deadline is lost there.
		return "", false
	}
	var what string
	found := false
	var stack []ast.Node
	ast.Inspect(body, func(n ast.Node) bool {
		if found {
			return false
		}
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		stack = append(stack, n)
		switch n.(type) {
		case *ast.GoStmt, *ast.DeferStmt:
			stack = stack[:len(stack)-1]
			return false
		}
		if id, ok := n.(*ast.Ident); ok && info.Uses[id] == obj {
			if w, ok := reachesOutbound(info, vals, body, id, stack, depth+1); ok {
				what, found = w, true
			}
		}
		return true
	})
	return what, found
}

// isParam reports whether obj is a parameter of a function.
func isParam(info *types.Info, obj types.Object) bool {
	v, ok := obj.(*types.Var)
	if !ok || v.IsField() {
		return false
	}
	// Parameters live in the scope of their function's signature, which
	// go/types records as the scope of the FuncType.
	s := v.Parent()
	if s == nil {
		return false
	}
	for n, sc := range info.Scopes {
		if sc == s {
			_, isFunc := n.(*ast.FuncType)
			return isFunc && paramIn(n.(*ast.FuncType), v)
		}
	}
	return false
}

func paramIn(ft *ast.FuncType, v *types.Var) bool {
	if ft.Params == nil {
		return false
	}
	for _, f := range ft.Params.List {
		for _, n := range f.Names {
			if n.Pos() == v.Pos() {
				return true
			}
		}
	}
	return false
}
