package vet

import (
	"fmt"
	"go/ast"
	"go/constant"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/types/typeutil"
)

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

const (
	pkgGuardrail  = "github.com/guardrail-go/guardrail"
	pkgGuardhttp  = "github.com/guardrail-go/guardrail/guardhttp"
	pkgRetryable  = "github.com/hashicorp/go-retryablehttp"
	pkgAWSService = "github.com/aws/aws-sdk-go-v2/service/"
	pkgAWSConfig  = "github.com/aws/aws-sdk-go-v2/config"
	pkgGRPC       = "google.golang.org/grpc"
)

// skipFile reports whether f is a test or generated file, or belongs to a
// test-support package: one whose non-test files import "testing"
// (helpers such as a conformance suite or a test proxy), whose calls go to
// test servers too.
func skipFile(pass *analysis.Pass, f *ast.File) bool {
	return isTestFile(pass, f) || ast.IsGenerated(f) || testSupport(pass)
}

func testSupport(pass *analysis.Pass) bool {
	for _, f := range pass.Files {
		if isTestFile(pass, f) {
			continue
		}
		for _, imp := range f.Imports {
			if imp.Path.Value == `"testing"` {
				return true
			}
		}
	}
	return false
}

// callee returns the function or method a call statically calls, or nil.
func callee(info *types.Info, call *ast.CallExpr) *types.Func {
	return typeutil.StaticCallee(info, call)
}

// isFunc reports whether fn is the package-level function pkg.name.
func isFunc(fn *types.Func, pkg string, names ...string) bool {
	if fn == nil || fn.Pkg() == nil || fn.Pkg().Path() != pkg {
		return false
	}
	if sig, ok := fn.Type().(*types.Signature); !ok || sig.Recv() != nil {
		return false
	}
	for _, n := range names {
		if fn.Name() == n {
			return true
		}
	}
	return false
}

// isMethod reports whether fn is a method of the named type pkg.typ (or a
// pointer to it) with one of names.
func isMethod(fn *types.Func, pkg, typ string, names ...string) bool {
	if fn == nil {
		return false
	}
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Recv() == nil {
		return false
	}
	if !isNamed(sig.Recv().Type(), pkg, typ) {
		return false
	}
	for _, n := range names {
		if fn.Name() == n {
			return true
		}
	}
	return false
}

// isNamed reports whether t is pkg.name or *pkg.name.
func isNamed(t types.Type, pkg, name string) bool {
	if p, ok := types.Unalias(t).(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := types.Unalias(t).(*types.Named)
	if !ok || n.Obj().Pkg() == nil {
		return false
	}
	return n.Obj().Pkg().Path() == pkg && n.Obj().Name() == name
}

func isContext(t types.Type) bool { return t != nil && isNamed(t, "context", "Context") }

func isError(t types.Type) bool {
	return t != nil && types.Identical(t, types.Universe.Lookup("error").Type())
}

// funcType returns the signature node and body of a FuncDecl or FuncLit.
func funcParts(n ast.Node) (*ast.FuncType, *ast.BlockStmt) {
	switch f := n.(type) {
	case *ast.FuncDecl:
		return f.Type, f.Body
	case *ast.FuncLit:
		return f.Type, f.Body
	}
	return nil, nil
}

// ctxParam describes the caller's context a function can see: a
// context.Context parameter or a *http.Request one.
type ctxParam struct {
	name    string // how to reach it: "ctx", "r.Context()"
	handler bool   // the function is an http handler
}

// callerContext looks through the enclosing functions of a node (stack,
// outermost first) for a caller's context. It stops at a function started
// by a go statement or deferred: work there outlives the caller on purpose.
func callerContext(info *types.Info, stack []ast.Node) (ctxParam, bool) {
	for i := len(stack) - 1; i >= 0; i-- {
		switch n := stack[i].(type) {
		case *ast.GoStmt, *ast.DeferStmt:
			return ctxParam{}, false
		case *ast.FuncDecl, *ast.FuncLit:
			ft, _ := funcParts(n)
			if p, ok := paramContext(info, ft); ok {
				return p, true
			}
			if _, lit := n.(*ast.FuncLit); lit && i > 0 && runsLater(info, stack[i-1]) {
				return ctxParam{}, false
			}
		}
	}
	return ctxParam{}, false
}

// runsLater reports whether a function literal whose parent is p is kept
// to run after the enclosing call returns: returned, stored, or handed to
// a cleanup hook. The caller's context may be done by then.
func runsLater(info *types.Info, p ast.Node) bool {
	switch p := p.(type) {
	case *ast.ReturnStmt, *ast.AssignStmt, *ast.ValueSpec, *ast.KeyValueExpr, *ast.CompositeLit:
		return true
	case *ast.CallExpr:
		if fn := callee(info, p); fn != nil {
			switch fn.Name() {
			case "Cleanup", "AfterFunc", "RegisterOnShutdown", "OnStop", "OnShutdown":
				return true
			}
		}
	}
	return false
}

func paramContext(info *types.Info, ft *ast.FuncType) (ctxParam, bool) {
	if ft == nil || ft.Params == nil {
		return ctxParam{}, false
	}
	var out ctxParam
	found, writer := false, false
	for _, f := range ft.Params.List {
		t := info.TypeOf(f.Type)
		if t == nil {
			continue
		}
		if isNamed(t, "net/http", "ResponseWriter") {
			writer = true
		}
		for _, n := range f.Names {
			switch {
			case isContext(t) && !found:
				out.name, found = n.Name, true
			case isPtrTo(t, "net/http", "Request") && !found && n.Name != "_":
				out.name, found = n.Name+".Context()", true
			}
		}
	}
	if found && writer {
		out.handler = true
	}
	return out, found
}

func isPtrTo(t types.Type, pkg, name string) bool {
	p, ok := types.Unalias(t).(*types.Pointer)
	return ok && isNamed(p.Elem(), pkg, name)
}

// constInt returns the integer constant value of e.
func constInt(info *types.Info, e ast.Expr) (int64, bool) {
	tv, ok := info.Types[e]
	if !ok || tv.Value == nil {
		return 0, false
	}
	v := constant.ToInt(tv.Value)
	if v.Kind() != constant.Int {
		return 0, false
	}
	return constant.Int64Val(v)
}

// constString returns the string constant value of e.
func constString(info *types.Info, e ast.Expr) (string, bool) {
	tv, ok := info.Types[e]
	if !ok || tv.Value == nil || tv.Value.Kind() != constant.String {
		return "", false
	}
	return constant.StringVal(tv.Value), true
}

func constBool(info *types.Info, e ast.Expr) (bool, bool) {
	tv, ok := info.Types[e]
	if !ok || tv.Value == nil || tv.Value.Kind() != constant.Bool {
		return false, false
	}
	return constant.BoolVal(tv.Value), true
}

func isConst(info *types.Info, e ast.Expr) bool {
	tv, ok := info.Types[e]
	return ok && tv.Value != nil
}

// objOf returns the variable an identifier or a field selector denotes.
func objOf(info *types.Info, e ast.Expr) types.Object {
	switch e := ast.Unparen(e).(type) {
	case *ast.Ident:
		if o := info.Uses[e]; o != nil {
			return o
		}
		return info.Defs[e]
	case *ast.SelectorExpr:
		if sel, ok := info.Selections[e]; ok {
			return sel.Obj()
		}
		return info.Uses[e.Sel]
	}
	return nil
}

func calleeName(fn *types.Func) string {
	if fn == nil {
		return ""
	}
	if sig, ok := fn.Type().(*types.Signature); ok && sig.Recv() != nil {
		t := sig.Recv().Type()
		if p, ok := types.Unalias(t).(*types.Pointer); ok {
			t = p.Elem()
		}
		if n, ok := types.Unalias(t).(*types.Named); ok {
			return n.Obj().Name() + "." + fn.Name()
		}
		return fn.Name()
	}
	if fn.Pkg() != nil {
		return fn.Pkg().Name() + "." + fn.Name()
	}
	return fn.Name()
}

// hasPrefixPath reports whether the package of fn has one of prefixes.
func pkgPath(fn *types.Func) string {
	if fn == nil || fn.Pkg() == nil {
		return ""
	}
	return fn.Pkg().Path()
}

func within(n ast.Node, pos token.Pos) bool { return n.Pos() <= pos && pos < n.End() }

func lower(s string) string { return strings.ToLower(s) }
