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

// RetryLoop reports hand-written retry loops: a loop that makes an
// outbound call (or calls a function value returning an error), sleeps, and
// leaves once the call succeeds. It reports such a loop when it sleeps a
// constant or purely computed (exponential, linear) delay with no random
// jitter, when nothing bounds its attempts, when it retries every error
// without looking at which, and when it sleeps with time.Sleep although the
// caller's context is at hand.
var RetryLoop = &analysis.Analyzer{
	Name:     "retryloop",
	Doc:      "report hand-written retry loops that sleep without jitter, have no bound, retry every error unclassified, or sleep without watching the context",
	URL:      "https://pkg.go.dev/github.com/guardrail-go/guardrail/extra/vet#RetryLoop",
	Requires: []*analysis.Analyzer{inspect.Analyzer},
	Run:      runRetryLoop,
}

type sleep struct {
	pos      token.Pos
	dur      ast.Expr // nil when unknown
	watches  bool     // in a select that also waits for a context or channel
	timeSlp  bool     // time.Sleep or a bare <-time.After
	selected bool
}

type loopScan struct {
	ops    []*ast.CallExpr
	errs   map[types.Object]bool // the error variables the ops' results go to
	sleeps []sleep
	ifs    []*ast.IfStmt
	nodes  []ast.Node // every node, for the later checks
	random bool       // the loop draws a random number somewhere
}

func runRetryLoop(pass *analysis.Pass) (any, error) {
	r := newReporter(pass)
	vals := newValues(pass)
	info := pass.TypesInfo
	ins := pass.ResultOf[inspect.Analyzer].(*inspector.Inspector)
	files := map[*ast.File]bool{}
	for _, f := range pass.Files {
		files[f] = !skipFile(pass, f)
	}
	ins.WithStack([]ast.Node{(*ast.ForStmt)(nil), (*ast.RangeStmt)(nil)}, func(n ast.Node, push bool, stack []ast.Node) bool {
		if !push {
			return true
		}
		if f, ok := stack[0].(*ast.File); !ok || !files[f] {
			return false
		}
		var body *ast.BlockStmt
		var cond ast.Expr
		switch l := n.(type) {
		case *ast.ForStmt:
			body, cond = l.Body, l.Cond
		case *ast.RangeStmt:
			body = l.Body
		}
		s := scanLoop(info, vals, body)
		if len(s.ops) == 0 || len(s.sleeps) == 0 || len(s.errs) == 0 {
			return true
		}
		if !exitsOnSuccess(info, s, body, cond) {
			return true
		}
		checkRetryLoop(pass, r, vals, n, cond, s, stack)
		return true
	})
	return nil, nil
}

// scanLoop collects the calls, sleeps and conditions of a loop body,
// leaving out nested loops (each is looked at on its own) and function
// literals (they run elsewhere).
func scanLoop(info *types.Info, vals *values, body *ast.BlockStmt) *loopScan {
	s := &loopScan{errs: map[types.Object]bool{}}
	inSelect := map[ast.Stmt]bool{}
	var stack []ast.Node
	ast.Inspect(body, func(n ast.Node) bool {
		if n == nil {
			stack = stack[:len(stack)-1]
			return true
		}
		if n != body {
			switch n.(type) {
			case *ast.ForStmt, *ast.RangeStmt, *ast.FuncLit:
				if c, ok := n.(*ast.FuncLit); ok {
					// Still notice randomness drawn in a helper literal.
					ast.Inspect(c, func(m ast.Node) bool {
						if call, ok := m.(*ast.CallExpr); ok && isRandom(info, call) {
							s.random = true
						}
						return true
					})
				}
				return false
			}
		}
		stack = append(stack, n)
		s.nodes = append(s.nodes, n)
		switch n := n.(type) {
		case *ast.IfStmt:
			s.ifs = append(s.ifs, n)
		case *ast.CallExpr:
			if isRandom(info, n) {
				s.random = true
			}
			fn := callee(info, n)
			if isFunc(fn, "time", "Sleep") && len(n.Args) == 1 {
				s.sleeps = append(s.sleeps, sleep{pos: n.Pos(), dur: n.Args[0], timeSlp: true})
				return true
			}
			if _, ok := outbound(info, n); ok || funcValueCall(info, n) {
				if e := errResult(info, n, stack); e != nil {
					s.ops = append(s.ops, n)
					s.errs[e] = true
				}
			}
		case *ast.SelectStmt:
			s.sleeps = append(s.sleeps, selectSleeps(info, vals, n)...)
			for _, c := range n.Body.List {
				if comm := c.(*ast.CommClause).Comm; comm != nil {
					inSelect[comm] = true
				}
			}
		case *ast.ExprStmt:
			if u, ok := ast.Unparen(n.X).(*ast.UnaryExpr); ok && u.Op == token.ARROW && !inSelect[n] {
				if d, ok := timerDuration(info, vals, u.X); ok {
					s.sleeps = append(s.sleeps, sleep{pos: u.Pos(), dur: d, timeSlp: true})
				}
			}
		}
		return true
	})
	return s
}

// isRandom reports whether call draws a random number (math/rand,
// math/rand/v2, crypto/rand) or calls something named for jitter.
func isRandom(info *types.Info, call *ast.CallExpr) bool {
	fn := callee(info, call)
	if fn != nil {
		switch pkgPath(fn) {
		case "math/rand", "math/rand/v2", "crypto/rand":
			return true
		}
		if strings.Contains(lower(fn.Name()), "jitter") || strings.Contains(lower(fn.Name()), "rand") {
			return true
		}
	}
	// A call of a func-typed field or variable named for randomness
	// (cfg.Rand()).
	if sel, ok := ast.Unparen(call.Fun).(*ast.SelectorExpr); ok {
		n := lower(sel.Sel.Name)
		if strings.Contains(n, "rand") || strings.Contains(n, "jitter") {
			return true
		}
	}
	return false
}

// funcValueCall reports whether call calls a function value (a parameter,
// a variable or a field of func type) rather than a declared function: the
// operation a generic retry helper repeats.
func funcValueCall(info *types.Info, call *ast.CallExpr) bool {
	switch f := ast.Unparen(call.Fun).(type) {
	case *ast.Ident:
		_, ok := info.Uses[f].(*types.Var)
		return ok
	case *ast.SelectorExpr:
		if sel, ok := info.Selections[f]; ok {
			return sel.Kind() == types.FieldVal
		}
	}
	return false
}

// errResult returns the variable the error result of call is assigned to.
func errResult(info *types.Info, call *ast.CallExpr, stack []ast.Node) types.Object {
	t := info.TypeOf(call.Fun)
	if t == nil {
		return nil
	}
	sig, ok := t.Underlying().(*types.Signature)
	if !ok || sig.Results().Len() == 0 || !isError(sig.Results().At(sig.Results().Len()-1).Type()) {
		return nil
	}
	if len(stack) < 2 {
		return nil
	}
	as, ok := stack[len(stack)-2].(*ast.AssignStmt)
	if !ok || len(as.Rhs) != 1 || as.Rhs[0] != call {
		return nil
	}
	last := as.Lhs[len(as.Lhs)-1]
	if id, ok := last.(*ast.Ident); ok && id.Name == "_" {
		return nil
	}
	return objOf(info, last)
}

// selectSleeps returns the timer waits among a select's cases. Each
// watches the context (or something else) when the select has another case.
func selectSleeps(info *types.Info, vals *values, sel *ast.SelectStmt) []sleep {
	var out []sleep
	cases := 0
	for _, c := range sel.Body.List {
		cc := c.(*ast.CommClause)
		cases++
		var x ast.Expr
		switch comm := cc.Comm.(type) {
		case *ast.ExprStmt:
			x = comm.X
		case *ast.AssignStmt:
			if len(comm.Rhs) == 1 {
				x = comm.Rhs[0]
			}
		}
		u, ok := ast.Unparen(x).(*ast.UnaryExpr)
		if !ok || u.Op != token.ARROW {
			continue
		}
		if d, ok := timerDuration(info, vals, u.X); ok {
			out = append(out, sleep{pos: u.Pos(), dur: d, selected: true})
		}
	}
	for i := range out {
		out[i].watches = cases > 1
	}
	return out
}

// timerDuration recognises time.After(d), time.NewTimer(d).C and
// time.Tick-free timer channels, returning d (nil when the timer cannot be
// traced to its duration).
func timerDuration(info *types.Info, vals *values, ch ast.Expr) (ast.Expr, bool) {
	ch = ast.Unparen(ch)
	if call, ok := ch.(*ast.CallExpr); ok {
		if fn := callee(info, call); isFunc(fn, "time", "After") && len(call.Args) == 1 {
			return call.Args[0], true
		}
		if fn := callee(info, call); isMethod(fn, "time", "Time", "Sub") {
			return nil, false
		}
		return nil, false
	}
	sel, ok := ch.(*ast.SelectorExpr)
	if !ok || sel.Sel.Name != "C" || !isNamed(info.TypeOf(sel.X), "time", "Timer") {
		return nil, false
	}
	outs, ok := vals.origins(sel.X)
	if ok && len(outs) == 1 {
		if call, isCall := outs[0].expr.(*ast.CallExpr); isCall {
			if fn := callee(info, call); isFunc(fn, "time", "NewTimer") && len(call.Args) == 1 {
				return call.Args[0], true
			}
		}
	}
	return nil, true
}

// exitsOnSuccess reports whether the loop is a retry: it ends when the
// call's error is nil (if err == nil { return }, for err != nil, or
// if err != nil { ...; continue } followed by a return or break).
func exitsOnSuccess(info *types.Info, s *loopScan, body *ast.BlockStmt, cond ast.Expr) bool {
	if cond != nil && errCompare(info, s.errs, cond, token.NEQ) {
		return true
	}
	for _, ifs := range s.ifs {
		if errCompare(info, s.errs, ifs.Cond, token.EQL) && leaves(ifs.Body) {
			return true
		}
	}
	for i, st := range body.List {
		ifs, ok := st.(*ast.IfStmt)
		if !ok || !errCompare(info, s.errs, ifs.Cond, token.NEQ) || len(ifs.Body.List) == 0 {
			continue
		}
		if br, ok := ifs.Body.List[len(ifs.Body.List)-1].(*ast.BranchStmt); !ok || br.Tok != token.CONTINUE {
			continue
		}
		for _, after := range body.List[i+1:] {
			switch a := after.(type) {
			case *ast.ReturnStmt:
				return true
			case *ast.BranchStmt:
				if a.Tok == token.BREAK {
					return true
				}
			}
		}
	}
	return false
}

// errCompare reports whether cond is, or has as a conjunct, err op nil for
// one of errs.
func errCompare(info *types.Info, errs map[types.Object]bool, cond ast.Expr, op token.Token) bool {
	b, ok := ast.Unparen(cond).(*ast.BinaryExpr)
	if !ok {
		return false
	}
	if b.Op == token.LAND {
		return errCompare(info, errs, b.X, op) || errCompare(info, errs, b.Y, op)
	}
	if b.Op != op {
		return false
	}
	return errs[objOf(info, b.X)] && isNilExpr(info, b.Y) || errs[objOf(info, b.Y)] && isNilExpr(info, b.X)
}

func isNilExpr(info *types.Info, e ast.Expr) bool {
	_, ok := objOf(info, e).(*types.Nil)
	return ok
}

// leaves reports whether a block ends in a return or break.
func leaves(b *ast.BlockStmt) bool {
	if len(b.List) == 0 {
		return false
	}
	switch l := b.List[len(b.List)-1].(type) {
	case *ast.ReturnStmt:
		return true
	case *ast.BranchStmt:
		return l.Tok == token.BREAK
	}
	return false
}

func checkRetryLoop(pass *analysis.Pass, r *reporter, vals *values, loop ast.Node, cond ast.Expr, s *loopScan, stack []ast.Node) {
	info := pass.TypesInfo
	pos := loop.Pos()

	// 1. Jitter.
	if !s.random {
		for _, sl := range s.sleeps {
			if sl.dur == nil {
				continue
			}
			kind, pure := delayKind(info, vals, sl.dur, map[types.Object]bool{})
			if !pure {
				continue
			}
			switch kind {
			case delayConst:
				r.report(pos, "retry loop sleeps a constant delay with no jitter: clients that failed together retry together, in waves; add random jitter (or use guardrail.Do)")
			case delayExp:
				r.report(pos, "retry loop sleeps an exponential delay with no jitter: clients that failed together retry together, in waves; add random jitter (or use guardrail.Do)")
			default:
				r.report(pos, "retry loop sleeps a computed delay with no jitter: clients that failed together retry together, in waves; add random jitter (or use guardrail.Do)")
			}
			break
		}
	}

	// 2. Bound.
	if _, isFor := loop.(*ast.ForStmt); isFor && !bounded(info, s, cond) {
		r.report(pos, "retry loop has no bound: it retries until the call succeeds, which against a dead dependency is forever; bound the attempts")
	}

	// 3. Classification.
	if !classifies(info, s) {
		r.report(pos, "retry loop retries every error without classifying it: a permanent failure (bad request, auth) is retried as if it could pass; retry only errors declared retryable")
	}

	// 4. Context.
	if cp, ok := callerContext(info, stack); ok && cp.name != "_" {
		for _, sl := range s.sleeps {
			if sl.timeSlp {
				done := cp.name + ".Done()"
				r.report(pos, "retry loop sleeps without watching %s: a caller that gave up still waits out every delay; select on %s and a timer", cp.name, done)
				break
			}
		}
	}
}

type delay int

const (
	delayConst delay = iota
	delayExp
	delayOther
)

// delayKind reports whether the delay expression e is computed only from
// constants, the loop's own variables, parameters and arithmetic (so it
// carries no jitter), and how: constant, exponential, other.
func delayKind(info *types.Info, vals *values, e ast.Expr, seen map[types.Object]bool) (delay, bool) {
	e = ast.Unparen(e)
	if isConst(info, e) {
		return delayConst, true
	}
	switch x := e.(type) {
	case *ast.BinaryExpr:
		k1, ok1 := delayKind(info, vals, x.X, seen)
		k2, ok2 := delayKind(info, vals, x.Y, seen)
		if !ok1 || !ok2 {
			return 0, false
		}
		if x.Op == token.SHL || k1 == delayExp || k2 == delayExp {
			return delayExp, true
		}
		if k1 == delayConst && k2 == delayConst {
			return delayConst, true
		}
		return delayOther, true
	case *ast.UnaryExpr:
		return delayKind(info, vals, x.X, seen)
	case *ast.CallExpr:
		if tv, ok := info.Types[x.Fun]; ok && tv.IsType() && len(x.Args) == 1 {
			return delayKind(info, vals, x.Args[0], seen)
		}
		fn := callee(info, x)
		pow := isFunc(fn, "math", "Pow", "Exp2")
		if !pow && !isFunc(fn, "math", "Min", "Max") {
			id, ok := ast.Unparen(x.Fun).(*ast.Ident)
			if !ok || (id.Name != "min" && id.Name != "max") {
				return 0, false
			}
			if _, ok := info.Uses[id].(*types.Builtin); !ok {
				return 0, false
			}
		}
		k := delayConst
		for _, a := range x.Args {
			ka, ok := delayKind(info, vals, a, seen)
			if !ok {
				return 0, false
			}
			if ka > k {
				k = ka
			}
		}
		if pow {
			k = delayExp
		}
		return k, true
	case *ast.Ident, *ast.SelectorExpr:
		obj, ok := objOf(info, x).(*types.Var)
		if !ok {
			return 0, false
		}
		if seen[obj] {
			return delayOther, true
		}
		seen[obj] = true
		as := vals.of[obj]
		if vals.escapes[obj] {
			return 0, false
		}
		if len(as) == 0 {
			// A parameter or a field set elsewhere: the same on every try.
			return delayConst, true
		}
		k := delayConst
		for _, a := range as {
			if a.idx != -1 || a.rhs == nil {
				if a.rhs == nil && a.idx == -1 {
					continue
				}
				return 0, false
			}
			ka, ok := delayKind(info, vals, a.rhs, seen)
			if !ok {
				return 0, false
			}
			switch a.op {
			case token.MUL_ASSIGN, token.SHL_ASSIGN:
				ka = delayExp
			case token.ADD_ASSIGN, token.SUB_ASSIGN, token.QUO_ASSIGN:
				ka = max(ka, delayOther)
			case token.ASSIGN, token.DEFINE:
			default:
				return 0, false
			}
			k = max(k, ka)
		}
		return k, true
	}
	return 0, false
}

// bounded reports whether something ends the loop besides success: a
// counter or clock compared in the loop's condition or an if, the context
// watched, or a select waiting on something besides the timer.
func bounded(info *types.Info, s *loopScan, cond ast.Expr) bool {
	if cond != nil && hasBoundCompare(info, s, cond) {
		return true
	}
	for _, sl := range s.sleeps {
		if sl.watches {
			return true
		}
	}
	for _, ifs := range s.ifs {
		if hasBoundCompare(info, s, ifs.Cond) {
			return true
		}
		// if !retry { return err }: something besides the error's being
		// nil ends the loop (a strategy's verdict, a flag).
		if leaves(ifs.Body) && !errCompare(info, s.errs, ifs.Cond, token.EQL) && !errCompare(info, s.errs, ifs.Cond, token.NEQ) {
			return true
		}
	}
	for _, n := range s.nodes {
		switch n := n.(type) {
		case *ast.CallExpr:
			if sel, ok := ast.Unparen(n.Fun).(*ast.SelectorExpr); ok {
				if isContext(info.TypeOf(sel.X)) && (sel.Sel.Name == "Err" || sel.Sel.Name == "Done") {
					return true
				}
			}
			fn := callee(info, n)
			if isFunc(fn, "time", "Since", "Until") || isMethod(fn, "time", "Time", "After", "Before") {
				return true
			}
		case *ast.SwitchStmt:
			return true // a switch may well end the loop on a count; do not guess
		}
	}
	return false
}

// hasBoundCompare reports whether e compares something other than an
// error with nil: a count, a time, a size.
func hasBoundCompare(info *types.Info, s *loopScan, e ast.Expr) bool {
	found := false
	ast.Inspect(e, func(n ast.Node) bool {
		b, ok := n.(*ast.BinaryExpr)
		if !ok {
			return !found
		}
		switch b.Op {
		case token.LSS, token.GTR, token.LEQ, token.GEQ:
			found = true
		case token.EQL, token.NEQ:
			if isNilExpr(info, b.X) || isNilExpr(info, b.Y) {
				break
			}
			t := info.TypeOf(b.X)
			if t != nil {
				if basic, ok := t.Underlying().(*types.Basic); ok && basic.Info()&types.IsInteger != 0 {
					found = true
				}
			}
		}
		return !found
	})
	return found
}

// classifies reports whether the loop looks at which error it got before
// retrying: errors.Is or As, a type assertion, a comparison with a
// sentinel, a call that takes the error (other than logging or wrapping),
// a method of the error, an HTTP status, or a return on any error.
func classifies(info *types.Info, s *loopScan) bool {
	isErr := func(e ast.Expr) bool { return s.errs[objOf(info, e)] }
	for _, n := range s.nodes {
		switch n := n.(type) {
		case *ast.TypeAssertExpr:
			if isErr(n.X) {
				return true
			}
		case *ast.TypeSwitchStmt:
			return true
		case *ast.SwitchStmt:
			if n.Tag != nil && isErr(n.Tag) {
				return true
			}
		case *ast.BinaryExpr:
			if (n.Op == token.EQL || n.Op == token.NEQ) && (isErr(n.X) && !isNilExpr(info, n.Y) || isErr(n.Y) && !isNilExpr(info, n.X)) {
				return true
			}
		case *ast.SelectorExpr:
			if n.Sel.Name == "StatusCode" || n.Sel.Name == "Code" {
				return true
			}
			if isErr(n.X) && n.Sel.Name != "Error" {
				return true
			}
		case *ast.CallExpr:
			fn := callee(info, n)
			if isFunc(fn, "errors", "Is", "As") {
				for _, a := range n.Args {
					if isErr(a) {
						return true
					}
				}
			}
			if logging(fn) {
				continue
			}
			for _, a := range n.Args {
				if isErr(a) {
					return true
				}
				if c, ok := ast.Unparen(a).(*ast.CallExpr); ok {
					if sel, ok := ast.Unparen(c.Fun).(*ast.SelectorExpr); ok && isErr(sel.X) {
						return true // strings.Contains(err.Error(), ...)
					}
				}
			}
		case *ast.IfStmt:
			// if err != nil { return err }: errors are not retried at all;
			// the loop retries on something else it inspects.
			if b, ok := ast.Unparen(n.Cond).(*ast.BinaryExpr); ok && b.Op == token.NEQ && (isErr(b.X) || isErr(b.Y)) {
				if len(n.Body.List) > 0 {
					if _, ret := n.Body.List[len(n.Body.List)-1].(*ast.ReturnStmt); ret {
						return true
					}
				}
			}
		}
	}
	return false
}

// logging reports whether fn only records or wraps an error: fmt, log,
// slog, errors.New/Join, or a method named like a logger's.
func logging(fn *types.Func) bool {
	if fn == nil {
		return false
	}
	switch pkgPath(fn) {
	case "fmt", "log", "log/slog", "testing", "errors":
		return true
	}
	n := fn.Name()
	for _, p := range []string{"Print", "Log", "Debug", "Info", "Warn", "Error", "Fatal", "Trace", "Notice", "With", "Add", "Record", "Observe", "Inc", "Set", "Send"} {
		if strings.HasPrefix(n, p) {
			return true
		}
	}
	return false
}
