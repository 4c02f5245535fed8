package vet

import (
	"go/ast"
	"go/token"
	"go/types"
	"strings"
)

// defaultAttempts is guardrail.DefaultMaxAttempts, what a zero MaxAttempts
// means in guardrail.Policy and guardhttp.Config.
const defaultAttempts = 3

// attemptsOf returns the fewest attempts the MaxAttempts values allow: a
// value left out is the default. known is false when one is not a
// constant.
func attemptsOf(info *types.Info, vals []ast.Expr) (n int64, known bool) {
	n = -1
	for _, v := range vals {
		a := int64(defaultAttempts)
		if v != nil {
			c, ok := constInt(info, v)
			if !ok {
				return 0, false
			}
			if c != 0 {
				a = c
			}
		}
		if n < 0 || a < n {
			n = a
		}
	}
	return n, n >= 0
}

// policyAttempts returns the attempts of the guardrail.Policy expression e:
// nil means the default policy.
func policyAttempts(info *types.Info, vals *values, e ast.Expr) (int64, bool) {
	if isNilExpr(info, e) {
		return defaultAttempts, true
	}
	fv, ok := vals.field(e, pkgGuardrail, "Policy", "MaxAttempts")
	if !ok {
		return 0, false
	}
	return attemptsOf(info, fv)
}

// policyIdempotent reports whether the Policy e is surely Idempotent.
func policyIdempotent(info *types.Info, vals *values, e ast.Expr) bool {
	fv, ok := vals.field(e, pkgGuardrail, "Policy", "Idempotent")
	if !ok || len(fv) == 0 {
		return false
	}
	for _, v := range fv {
		if v == nil {
			return false
		}
		if b, ok := constBool(info, v); !ok || !b {
			return false
		}
	}
	return true
}

// guardhttpConfigs traces an *http.Client or *guardhttp.Transport
// expression to the guardhttp.Config expressions it was built with
// (guardhttp.NewClient(cfg), guardhttp.NewTransport(base, cfg), or an
// http.Client literal whose Transport is one). ok is false unless every
// origin is one of these.
func guardhttpConfigs(info *types.Info, vals *values, e ast.Expr) (cfgs []ast.Expr, ok bool) {
	outs, ok := vals.origins(e)
	if !ok || len(outs) == 0 {
		return nil, false
	}
	for _, o := range outs {
		switch x := o.expr.(type) {
		case *ast.CallExpr:
			fn := callee(info, x)
			switch {
			case isFunc(fn, pkgGuardhttp, "NewClient") && len(x.Args) >= 1 && o.idx <= 0:
				cfgs = append(cfgs, x.Args[len(x.Args)-1])
			case isFunc(fn, pkgGuardhttp, "NewTransport") && len(x.Args) >= 2 && o.idx <= 0:
				cfgs = append(cfgs, x.Args[len(x.Args)-1])
			default:
				return nil, false
			}
		case *ast.CompositeLit:
			if !isNamed(info.TypeOf(x), "net/http", "Client") {
				return nil, false
			}
			t, has := fieldOf(x, "Transport")
			if !has {
				return nil, false
			}
			c, ok := guardhttpConfigs(info, vals, t)
			if !ok {
				return nil, false
			}
			cfgs = append(cfgs, c...)
		default:
			return nil, false
		}
	}
	return cfgs, true
}

// guardhttpRetries returns the fewest attempts of the guardhttp clients e
// was built from, and whether all of them have IdempotencyKeys surely off.
func guardhttpRetries(info *types.Info, vals *values, e ast.Expr) (attempts int64, keysOff, ok bool) {
	cfgs, ok := guardhttpConfigs(info, vals, e)
	if !ok {
		return 0, false, false
	}
	attempts = -1
	keysOff = true
	for _, c := range cfgs {
		fv, ok := vals.field(c, pkgGuardhttp, "Config", "MaxAttempts")
		if !ok {
			return 0, false, false
		}
		n, known := attemptsOf(info, fv)
		if !known {
			return 0, false, false
		}
		if attempts < 0 || n < attempts {
			attempts = n
		}
		kv, ok := vals.field(c, pkgGuardhttp, "Config", "IdempotencyKeys")
		if !ok {
			keysOff = false
			continue
		}
		for _, v := range kv {
			if v == nil {
				continue
			}
			if b, ok := constBool(info, v); !ok || b {
				keysOff = false
			}
		}
	}
	return attempts, keysOff, attempts >= 0
}

// receiver returns the receiver expression of a method call.
func receiver(call *ast.CallExpr) ast.Expr {
	if sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr); ok {
		return sel.X
	}
	return nil
}

// selfRetrying reports whether call goes through a client that retries on
// its own, naming it and its attempts.
func selfRetrying(info *types.Info, vals *values, call *ast.CallExpr) (string, int64, bool) {
	fn := callee(info, call)
	recv := receiver(call)
	if fn == nil || recv == nil {
		return "", 0, false
	}
	switch {
	case isMethod(fn, "net/http", "Client", "Do", "Get", "Head", "Post", "PostForm"),
		isMethod(fn, pkgGuardhttp, "Transport", "RoundTrip"):
		if n, _, ok := guardhttpRetries(info, vals, recv); ok && n > 1 {
			return "a guardhttp client", n, true
		}
		// retryablehttp.Client.StandardClient() keeps retrying underneath.
		if outs, ok := vals.origins(recv); ok && len(outs) == 1 {
			if c, isCall := outs[0].expr.(*ast.CallExpr); isCall {
				if f := callee(info, c); isMethod(f, pkgRetryable, "Client", "StandardClient") {
					if n, ok := retryableAttempts(info, vals, receiver(c)); ok && n > 1 {
						return "a go-retryablehttp client", n, true
					}
				}
			}
		}
	case isMethod(fn, pkgRetryable, "Client", "Do", "Get", "Head", "Post", "PostForm"):
		if n, ok := retryableAttempts(info, vals, recv); ok && n > 1 {
			return "a go-retryablehttp client", n, true
		}
	case strings.HasPrefix(pkgPath(fn), pkgAWSService) && clientMethod(fn):
		if awsDefaultRetryer(info, vals, recv) {
			return "an AWS SDK client with its default retryer", defaultAttempts, true
		}
	}
	return "", 0, false
}

// retryableAttempts returns the attempts of a go-retryablehttp client:
// RetryMax+1, RetryMax being 4 from NewClient unless set.
func retryableAttempts(info *types.Info, vals *values, e ast.Expr) (int64, bool) {
	outs, via, ok := vals.originsVia(e)
	if !ok || len(outs) == 0 {
		return 0, false
	}
	for _, o := range outs {
		c, isCall := o.expr.(*ast.CallExpr)
		if !isCall || !isFunc(callee(info, c), pkgRetryable, "NewClient") {
			return 0, false
		}
	}
	n := int64(4)
	for obj := range via {
		for _, v := range vals.fields[obj]["RetryMax"] {
			c, ok := constInt(info, v)
			if !ok {
				return 0, false
			}
			n = min(n, c)
		}
	}
	return n + 1, true
}

// awsRetryOptions are the names that change an AWS SDK client's retryer.
var awsRetryOptions = []string{"Retryer", "RetryMaxAttempts", "RetryMode", "WithRetryer", "WithRetryMaxAttempts", "WithRetryMode"}

// awsDefaultRetryer reports whether the AWS SDK client e was built, where
// we can see it, with nothing that changes its retryer: NewFromConfig(cfg)
// without options, cfg from config.LoadDefaultConfig without retry options.
func awsDefaultRetryer(info *types.Info, vals *values, e ast.Expr) bool {
	outs, ok := vals.origins(e)
	if !ok || len(outs) != 1 {
		return false
	}
	c, isCall := outs[0].expr.(*ast.CallExpr)
	if !isCall {
		return false
	}
	fn := callee(info, c)
	if fn == nil || !strings.HasPrefix(pkgPath(fn), pkgAWSService) || fn.Name() != "NewFromConfig" || len(c.Args) != 1 {
		return false
	}
	couts, via, ok := vals.originsVia(c.Args[0])
	if !ok || len(couts) != 1 {
		return false
	}
	lc, isCall := couts[0].expr.(*ast.CallExpr)
	if !isCall || !isFunc(callee(info, lc), pkgAWSConfig, "LoadDefaultConfig") {
		return false
	}
	for _, a := range lc.Args[1:] {
		if mentions(a, awsRetryOptions) {
			return false
		}
	}
	for obj := range via {
		for _, f := range awsRetryOptions {
			if len(vals.fields[obj][f]) > 0 {
				return false
			}
		}
	}
	return true
}

// mentions reports whether any identifier in n has one of names.
func mentions(n ast.Node, names []string) bool {
	found := false
	ast.Inspect(n, func(m ast.Node) bool {
		if id, ok := m.(*ast.Ident); ok {
			for _, s := range names {
				if id.Name == s {
					found = true
				}
			}
		}
		return !found
	})
	return found
}

// unsafeMethod returns the method of a NewRequest or NewRequestWithContext
// call when it is POST or PATCH.
func unsafeMethod(info *types.Info, call *ast.CallExpr) (string, bool) {
	fn := callee(info, call)
	var m ast.Expr
	switch {
	case isFunc(fn, "net/http", "NewRequest") && len(call.Args) == 3:
		m = call.Args[0]
	case isFunc(fn, "net/http", "NewRequestWithContext") && len(call.Args) == 4:
		m = call.Args[1]
	default:
		return "", false
	}
	s, ok := constString(info, m)
	if !ok {
		return "", false
	}
	s = strings.ToUpper(s)
	return s, s == "POST" || s == "PATCH"
}

// keyedOrHandedOff reports whether, in body, the request variables in reqs
// get an Idempotency-Key header, have their Header replaced, or are handed
// to a function other than the send (which may set one).
func keyedOrHandedOff(info *types.Info, body ast.Node, reqs map[types.Object]bool, send *ast.CallExpr) bool {
	isReq := func(e ast.Expr) bool { return reqs[objOf(info, e)] }
	headerOf := func(e ast.Expr) bool {
		sel, ok := ast.Unparen(e).(*ast.SelectorExpr)
		return ok && sel.Sel.Name == "Header" && isReq(sel.X)
	}
	found := false
	ast.Inspect(body, func(n ast.Node) bool {
		if found {
			return false
		}
		switch n := n.(type) {
		case *ast.CallExpr:
			if n == send {
				return true
			}
			if sel, ok := ast.Unparen(n.Fun).(*ast.SelectorExpr); ok && headerOf(sel.X) {
				if len(n.Args) >= 1 {
					if k, ok := constString(info, n.Args[0]); !ok || strings.EqualFold(k, "Idempotency-Key") {
						found = true
					}
				}
				return true
			}
			for _, a := range n.Args {
				if isReq(a) {
					found = true
				}
			}
		case *ast.AssignStmt:
			for _, l := range n.Lhs {
				if headerOf(l) {
					found = true
				}
				if ix, ok := l.(*ast.IndexExpr); ok && headerOf(ix.X) {
					if k, ok := constString(info, ix.Index); !ok || strings.EqualFold(k, "Idempotency-Key") {
						found = true
					}
				}
			}
		case *ast.UnaryExpr:
			if n.Op == token.AND && isReq(n.X) {
				found = true
			}
		}
		return true
	})
	return found
}
