package vet

import (
	"go/ast"
	"go/types"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/passes/inspect"
	"golang.org/x/tools/go/ast/inspector"
)

// Idempotency reports POST and PATCH requests sent where a guardrail layer
// retries without an Idempotency-Key:
//
//   - through a guardhttp client that retries and does not generate keys
//     (Config.IdempotencyKeys off): the client must then refuse to resend
//     the request once it may have reached the server, so a lost response
//     fails the call the retries were meant to save;
//   - inside guardrail.Do with a Policy that declares the operation
//     Idempotent and retries: a retry after a lost response runs the
//     operation twice.
//
// A request whose header is set by a helper, or that is handed to one, is
// left alone.
var Idempotency = &analysis.Analyzer{
	Name:     "idempotency",
	Doc:      "report a POST or PATCH sent through a retrying guardrail client (or a Policy declared Idempotent) without an Idempotency-Key and without guardhttp.Config.IdempotencyKeys",
	URL:      "https://pkg.go.dev/github.com/guardrail-go/guardrail/extra/vet#Idempotency",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      runIdempotency,
}

func runIdempotency(pass *analysis.Pass) (any, error) {
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
		case isMethod(fn, "net/http", "Client", "Post", "PostForm"):
			if n, off, ok := guardhttpRetries(info, vals, receiver(call)); ok && n > 1 && off {
				r.report(call.Pos(), "POST through a retrying guardhttp client, with no Idempotency-Key and Config.IdempotencyKeys off: once sent it is not retried (it could run twice), so a lost response fails the call; enable IdempotencyKeys (with a server that deduplicates), or build the request and set the header")
			}
		case isMethod(fn, "net/http", "Client", "Do"), isMethod(fn, pkgGuardhttp, "Transport", "RoundTrip"):
			if len(call.Args) != 1 {
				return true
			}
			n, off, ok := guardhttpRetries(info, vals, receiver(call))
			if !ok || n <= 1 || !off {
				return true
			}
			method, reqs, ok := unkeyedRequest(info, vals, call.Args[0], call, enclosingBody(stack))
			if ok {
				r.report(call.Pos(), "%s through a retrying guardhttp client, with no Idempotency-Key and Config.IdempotencyKeys off: once sent it is not retried (it could run twice), so a lost response fails the call; set an Idempotency-Key the server deduplicates by, or enable IdempotencyKeys", method)
				_ = reqs
			}
		case isFunc(fn, pkgGuardrail, "Do", "DoCall") && len(call.Args) >= 3:
			attempts, ok := policyAttempts(info, vals, call.Args[1])
			if !ok || attempts <= 1 || !policyIdempotent(info, vals, call.Args[1]) {
				return true
			}
			if isFunc(fn, pkgGuardrail, "DoCall") {
				return true // the Call overrides Idempotent; do not guess
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
				if f := callee(info, c); !isMethod(f, "net/http", "Client", "Do") || len(c.Args) != 1 {
					return true
				}
				if method, _, ok := unkeyedRequest(info, vals, c.Args[0], c, op.Body); ok {
					r.report(c.Pos(), "%s inside guardrail.Do with a Policy declared Idempotent, with no Idempotency-Key: a retry after a lost response runs it twice; send an Idempotency-Key the server deduplicates by", method)
				}
				return true
			})
		}
		return true
	})
	return nil, nil
}

// unkeyedRequest reports whether req, sent by send, was built in body by
// http.NewRequest[WithContext] as a POST or PATCH and never gets an
// Idempotency-Key there.
func unkeyedRequest(info *types.Info, vals *values, req ast.Expr, send *ast.CallExpr, body *ast.BlockStmt) (string, map[types.Object]bool, bool) {
	if body == nil {
		return "", nil, false
	}
	outs, via, ok := vals.originsVia(req)
	if !ok || len(outs) != 1 || len(via) == 0 {
		return "", nil, false
	}
	c, isCall := outs[0].expr.(*ast.CallExpr)
	if !isCall || outs[0].idx > 0 || !within(body, c.Pos()) {
		return "", nil, false
	}
	method, unsafe := unsafeMethod(info, c)
	if !unsafe {
		return "", nil, false
	}
	for obj := range via {
		if !within(body, obj.Pos()) {
			return "", nil, false
		}
	}
	if keyedOrHandedOff(info, body, via, send) {
		return "", nil, false
	}
	return method, via, true
}
