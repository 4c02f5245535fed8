package vet

import (
	"go/ast"
	"go/token"
	"go/types"
	"strings"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Timeout reports outbound calls that nothing bounds: the package-level
// http.Get, Head, Post and PostForm and uses of http.DefaultClient (no
// timeout), an http.Client literal without Timeout whose Transport sets no
// timeout either, net.Dial and a zero net.Dialer's Dial, and
// http.NewRequest in a function that has a caller's context to pass.
var Timeout = &analysis.Analyzer{
	Name:     "timeout",
	Doc:      "report outbound calls without a timeout: http.Get and friends, http.DefaultClient, an http.Client without Timeout or a Transport with timeouts, net.Dial without a timeout, http.NewRequest where a context is at hand",
	URL:      "https://pkg.go.dev/github.com/guardrail-go/guardrail/extra/vet#Timeout",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      runTimeout,
}

// transportTimeouts are the http.Transport fields that bound some phase
// of a call; a Transport literal setting none of them is DefaultTransport's
// equal in the worst case: a server that accepts and never answers holds
// the call forever.
var transportTimeouts = []string{"ResponseHeaderTimeout", "DialContext", "Dial", "DialTLSContext", "DialTLS", "TLSHandshakeTimeout"}

func runTimeout(pass *analysis.Pass) (any, error) {
	r := newReporter(pass)
	vals := newValues(pass)
	info := pass.TypesInfo
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	filter := []ast.Node{(*ast.CallExpr)(nil), (*ast.SelectorExpr)(nil), (*ast.CompositeLit)(nil)}
	var files = map[*ast.File]bool{}
	for _, f := range pass.Files {
		files[f] = !skipFile(pass, f)
	}
	ins.WithStack(filter, func(n ast.Node, push bool, stack []ast.Node) bool {
		if !push {
			return true
		}
		if f, ok := stack[0].(*ast.File); !ok || !files[f] {
			return false
		}
		switch n := n.(type) {
		case *ast.CallExpr:
			timeoutCall(pass, r, vals, n, stack)
		case *ast.SelectorExpr:
			if v, ok := info.Uses[n.Sel].(*types.Var); ok && v.Pkg() != nil && v.Pkg().Path() == "net/http" && v.Name() == "DefaultClient" {
				if !comparedOrConfigured(stack) {
					r.report(n.Pos(), "http.DefaultClient has no timeout: a server that stops answering holds the call forever; use a client with Timeout (or guardhttp)")
				}
			}
		case *ast.CompositeLit:
			if isNamed(info.TypeOf(n), "net/http", "Client") {
				clientLiteral(pass, r, vals, n, stack)
			}
		}
		return true
	})
	return nil, nil
}

// comparedOrConfigured reports whether the selector at the top of stack is
// compared (c == http.DefaultClient) or has a field set
// (http.DefaultClient.Timeout = d), which are not calls through it.
func comparedOrConfigured(stack []ast.Node) bool {
	if len(stack) < 2 {
		return false
	}
	n := stack[len(stack)-1]
	switch p := stack[len(stack)-2].(type) {
	case *ast.BinaryExpr:
		return p.Op == token.EQL || p.Op == token.NEQ
	case *ast.SelectorExpr:
		if len(stack) >= 3 {
			if as, ok := stack[len(stack)-3].(*ast.AssignStmt); ok {
				for _, l := range as.Lhs {
					if l == p {
						return true
					}
				}
			}
		}
	case *ast.UnaryExpr:
		return false
	case *ast.StarExpr:
		// *http.DefaultClient copies it, usually to set a Timeout on the copy.
		return p.X == n
	}
	return false
}

func timeoutCall(pass *analysis.Pass, r *reporter, vals *values, call *ast.CallExpr, stack []ast.Node) {
	info := pass.TypesInfo
	if id, ok := ast.Unparen(call.Fun).(*ast.Ident); ok && id.Name == "new" && len(call.Args) == 1 {
		if _, isBuiltin := info.Uses[id].(*types.Builtin); isBuiltin && isNamed(info.TypeOf(call.Args[0]), "net/http", "Client") {
			if !laterConfigured(vals, stack, call, "Timeout", "Transport") {
				r.report(call.Pos(), "new(http.Client) has no Timeout and the default Transport bounds no wait for an answer: a server that stops answering holds the call forever; set Timeout or a Transport with timeouts")
			}
		}
		return
	}
	fn := callee(info, call)
	if fn == nil {
		return
	}
	switch {
	case isFunc(fn, "net/http", "Get", "Head", "Post", "PostForm"):
		r.report(call.Pos(), "http.%s uses http.DefaultClient, which has no timeout: a server that stops answering holds the call forever; use a client with Timeout, or a request with a context deadline", fn.Name())
	case isFunc(fn, "net", "Dial", "DialTCP"):
		if len(call.Args) > 0 {
			if nw, ok := constString(info, call.Args[0]); ok && strings.HasPrefix(nw, "unix") {
				return // a local socket: connect does not wait on a network
			}
		}
		r.report(call.Pos(), "net.%s has no timeout: an unreachable host holds it for the kernel's connect timeout (minutes); use net.DialTimeout or a net.Dialer's DialContext", fn.Name())
	case isMethod(fn, "net", "Dialer", "Dial"):
		sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr)
		if !ok {
			return
		}
		t, ok1 := vals.field(sel.X, "net", "Dialer", "Timeout")
		d, ok2 := vals.field(sel.X, "net", "Dialer", "Deadline")
		if ok1 && ok2 && allZero(info, t) && allZero(info, d) {
			r.report(call.Pos(), "net.Dialer.Dial with neither Timeout nor Deadline has no bound; set Dialer.Timeout or use DialContext with a deadline")
		}
	case isFunc(fn, "net/http", "NewRequest"):
		cp, ok := callerContext(info, stack)
		if !ok || cp.name == "_" {
			return
		}
		if reqGetsContext(info, vals, call, stack) {
			return
		}
		r.report(call.Pos(), "http.NewRequest drops the caller's context although %s is at hand: its deadline and cancellation never reach this request; use http.NewRequestWithContext(%s, ...)", cp.name, cp.name)
	}
}

// allZero reports whether every value is the zero value: absent or the
// constant 0.
func allZero(info *types.Info, vals []ast.Expr) bool {
	for _, v := range vals {
		if v == nil {
			continue
		}
		if n, ok := constInt(info, v); ok && n == 0 {
			continue
		}
		return false
	}
	return true
}

// reqGetsContext reports whether the request a NewRequest call builds is
// later given a context (req.WithContext, req.Clone) or leaves the
// function before being sent, so another one may.
func reqGetsContext(info *types.Info, vals *values, call *ast.CallExpr, stack []ast.Node) bool {
	var req types.Object
	if len(stack) >= 2 {
		switch p := stack[len(stack)-2].(type) {
		case *ast.AssignStmt:
			if len(p.Rhs) == 1 && len(p.Lhs) >= 1 {
				req = objOf(info, p.Lhs[0])
			}
		case *ast.ValueSpec:
			if len(p.Values) == 1 && len(p.Names) >= 1 {
				req = info.Defs[p.Names[0]]
			}
		default:
			return true // used in place: we cannot follow it
		}
	}
	if req == nil {
		return true
	}
	body := enclosingBody(stack)
	if body == nil {
		return true
	}
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.CallExpr:
			if sel, ok := ast.Unparen(n.Fun).(*ast.SelectorExpr); ok && (sel.Sel.Name == "WithContext" || sel.Sel.Name == "Clone") && objOf(info, sel.X) == req {
				found = true
			}
			// Handed over with a context (client.Do(ctx, req),
			// withContext(ctx, req)): the callee attaches it.
			hasReq, hasCtx := false, false
			for _, a := range n.Args {
				if objOf(info, a) == req {
					hasReq = true
				}
				if isContext(info.TypeOf(a)) {
					hasCtx = true
				}
			}
			if hasReq && hasCtx {
				found = true
			}
		case *ast.ReturnStmt:
			for _, res := range n.Results {
				if objOf(info, res) == req {
					found = true
				}
			}
		}
		return !found
	})
	return found
}

// enclosingBody returns the body of the innermost function in stack.
func enclosingBody(stack []ast.Node) *ast.BlockStmt {
	for i := len(stack) - 1; i >= 0; i-- {
		if _, b := funcParts(stack[i]); b != nil {
			return b
		}
	}
	return nil
}

// laterConfigured reports whether the value built at n is stored in a
// variable or field that later gets one of the fields set.
func laterConfigured(vals *values, stack []ast.Node, n ast.Node, fields ...string) bool {
	var holder types.Object
outer:
	for i := len(stack) - 2; i >= 0; i-- {
		switch p := stack[i].(type) {
		case *ast.UnaryExpr, *ast.ParenExpr:
			continue
		case *ast.AssignStmt:
			for j, rhs := range p.Rhs {
				if within(rhs, n.Pos()) && j < len(p.Lhs) {
					holder = objOf(vals.info, p.Lhs[j])
				}
			}
		case *ast.ValueSpec:
			for j, rhs := range p.Values {
				if within(rhs, n.Pos()) && j < len(p.Names) {
					holder = vals.info.Defs[p.Names[j]]
				}
			}
		case *ast.KeyValueExpr:
			if id, ok := p.Key.(*ast.Ident); ok {
				holder = vals.info.Uses[id]
			}
		}
		break outer
	}
	if holder == nil {
		return false
	}
	if vals.escapes[holder] {
		return true
	}
	for _, f := range fields {
		if len(vals.fields[holder][f]) > 0 {
			return true
		}
	}
	return false
}

func clientLiteral(pass *analysis.Pass, r *reporter, vals *values, lit *ast.CompositeLit, stack []ast.Node) {
	info := pass.TypesInfo
	if v, ok := fieldOf(lit, "Timeout"); ok {
		if n, isConst := constInt(info, v); !isConst || n != 0 {
			return
		}
	}
	if len(lit.Elts) > 0 {
		if _, keyed := lit.Elts[0].(*ast.KeyValueExpr); !keyed {
			return
		}
	}
	if t, ok := fieldOf(lit, "Transport"); ok && !transportUnbounded(info, vals, t) {
		return
	}
	if laterConfigured(vals, stack, lit, "Timeout", "Transport") || configuredByCallee(pass, vals, stack, lit) {
		return
	}
	r.report(lit.Pos(), "http.Client without Timeout and without a Transport that sets timeouts: a server that stops answering holds the call forever; set Timeout, or a Transport with ResponseHeaderTimeout (or use guardhttp)")
}

// transportUnbounded reports whether we are sure the Transport expression
// sets no timeout: http.DefaultTransport itself, or an http.Transport
// literal with none of transportTimeouts.
func transportUnbounded(info *types.Info, vals *values, e ast.Expr) bool {
	outs, via, ok := vals.originsVia(e)
	if !ok || len(outs) == 0 {
		return false
	}
	for _, o := range outs {
		switch x := o.expr.(type) {
		case *ast.SelectorExpr:
			v, isVar := info.Uses[x.Sel].(*types.Var)
			if !isVar || v.Pkg() == nil || v.Pkg().Path() != "net/http" || v.Name() != "DefaultTransport" {
				return false
			}
		case *ast.CompositeLit:
			if !isNamed(info.TypeOf(x), "net/http", "Transport") {
				return false
			}
			for _, f := range transportTimeouts {
				if _, set := fieldOf(x, f); set {
					return false
				}
			}
		default:
			return false
		}
	}
	for obj := range via {
		for _, f := range transportTimeouts {
			if len(vals.fields[obj][f]) > 0 {
				return false
			}
		}
	}
	return true
}

// configuredByCallee reports whether the literal at the top of stack is an
// argument of a call whose callee may set its Timeout or Transport: any
// function of another package, or one of this package that assigns a field
// of that parameter or hands it on to another call.
func configuredByCallee(pass *analysis.Pass, vals *values, stack []ast.Node, lit ast.Node) bool {
	var call *ast.CallExpr
	argIdx := -1
	for i := len(stack) - 2; i >= 0 && call == nil; i-- {
		switch p := stack[i].(type) {
		case *ast.UnaryExpr, *ast.ParenExpr:
			continue
		case *ast.CallExpr:
			for j, a := range p.Args {
				if within(a, lit.Pos()) {
					call, argIdx = p, j
				}
			}
			if call == nil {
				return false
			}
		default:
			return false
		}
	}
	if call == nil {
		return false
	}
	fn := callee(pass.TypesInfo, call)
	if fn == nil || fn.Pkg() != pass.Pkg {
		return true
	}
	decl := funcDecl(pass, fn)
	if decl == nil || decl.Body == nil {
		return true
	}
	var params []*ast.Ident
	for _, f := range decl.Type.Params.List {
		params = append(params, f.Names...)
		if len(f.Names) == 0 {
			params = append(params, nil)
		}
	}
	if argIdx >= len(params) || params[argIdx] == nil {
		return true
	}
	param := pass.TypesInfo.Defs[params[argIdx]]
	if param == nil || vals.escapes[param] {
		return true
	}
	if len(vals.fields[param]) > 0 {
		return true
	}
	handed := false
	ast.Inspect(decl.Body, func(n ast.Node) bool {
		if c, ok := n.(*ast.CallExpr); ok {
			for _, a := range c.Args {
				if objOf(pass.TypesInfo, a) == param {
					handed = true
				}
			}
		}
		return !handed
	})
	return handed
}

// funcDecl finds the declaration of fn among the pass's files.
func funcDecl(pass *analysis.Pass, fn *types.Func) *ast.FuncDecl {
	for _, f := range pass.Files {
		if !within(f, fn.Pos()) {
			continue
		}
		for _, d := range f.Decls {
			if fd, ok := d.(*ast.FuncDecl); ok && pass.TypesInfo.Defs[fd.Name] == fn {
				return fd
			}
		}
	}
	return nil
}
