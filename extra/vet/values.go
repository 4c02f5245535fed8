package vet

import (
	"go/ast"
	"go/token"
	"go/types"

	"golang.org/x/tools/go/analysis"
)

// assign is one value given to a variable or field: rhs, or its idx-th
// result when rhs is a call returning several.
type assign struct {
	rhs ast.Expr
	idx int // -1: rhs is the value itself
	op  token.Token
}

// values indexes, for one package, every value assigned to each variable
// and struct field, and every field assigned through a variable
// (v.Field = x), so an expression can be traced back to where its value
// was built.
type values struct {
	info *types.Info
	pkg  *types.Package
	// of holds the assignments to a variable or field object.
	of map[types.Object][]assign
	// fields holds, per variable, the assignments to its fields by name.
	fields map[types.Object]map[string][]ast.Expr
	// escapes holds the variables whose address is taken or that are
	// passed to a function by pointer, which may then change them.
	escapes map[types.Object]bool
}

func newValues(pass *analysis.Pass) *values {
	v := &values{
		info:    pass.TypesInfo,
		pkg:     pass.Pkg,
		of:      map[types.Object][]assign{},
		fields:  map[types.Object]map[string][]ast.Expr{},
		escapes: map[types.Object]bool{},
	}
	for _, f := range pass.Files {
		ast.Inspect(f, func(n ast.Node) bool {
			switch n := n.(type) {
			case *ast.ValueSpec:
				for i, name := range n.Names {
					obj := v.info.Defs[name]
					if obj == nil {
						continue
					}
					switch {
					case len(n.Values) == len(n.Names):
						v.of[obj] = append(v.of[obj], assign{n.Values[i], -1, token.ASSIGN})
					case len(n.Values) == 1:
						v.of[obj] = append(v.of[obj], assign{n.Values[0], i, token.ASSIGN})
					default:
						// var x T: the zero value.
						v.of[obj] = append(v.of[obj], assign{nil, -1, token.ASSIGN})
					}
				}
			case *ast.AssignStmt:
				for i, l := range n.Lhs {
					var a assign
					switch {
					case len(n.Rhs) == len(n.Lhs):
						a = assign{n.Rhs[i], -1, n.Tok}
					case len(n.Rhs) == 1:
						a = assign{n.Rhs[0], i, n.Tok}
					default:
						continue
					}
					l = ast.Unparen(l)
					if obj := objOf(v.info, l); obj != nil {
						v.of[obj] = append(v.of[obj], a)
					}
					if sel, ok := l.(*ast.SelectorExpr); ok {
						if base := objOf(v.info, sel.X); base != nil {
							m := v.fields[base]
							if m == nil {
								m = map[string][]ast.Expr{}
								v.fields[base] = m
							}
							m[sel.Sel.Name] = append(m[sel.Sel.Name], a.rhs)
						}
					}
				}
			case *ast.RangeStmt:
				for _, e := range []ast.Expr{n.Key, n.Value} {
					if e != nil {
						if obj := objOf(v.info, e); obj != nil {
							v.of[obj] = append(v.of[obj], assign{nil, -2, token.ILLEGAL})
						}
					}
				}
			case *ast.CompositeLit:
				for _, el := range n.Elts {
					kv, ok := el.(*ast.KeyValueExpr)
					if !ok {
						continue
					}
					if id, ok := kv.Key.(*ast.Ident); ok {
						if obj, ok := v.info.Uses[id].(*types.Var); ok && obj.IsField() {
							v.of[obj] = append(v.of[obj], assign{kv.Value, -1, token.ASSIGN})
						}
					}
				}
			case *ast.UnaryExpr:
				if n.Op == token.AND {
					if obj := objOf(v.info, n.X); obj != nil {
						v.escapes[obj] = true
					}
				}
			}
			return true
		})
	}
	return v
}

// origin is a place a value was built: a composite literal, a call, nil.
type origin struct {
	expr ast.Expr // with parens and & removed; nil for a zero value
	idx  int      // result index when expr is a call with several results
}

// origins traces e back to where its values were built. ok is false when
// one of them cannot be seen (a parameter, a range variable, a value whose
// address escapes, a field never assigned in this package).
func (v *values) origins(e ast.Expr) (out []origin, ok bool) {
	out, _, ok = v.originsVia(e)
	return out, ok
}

// originsVia is origins that also returns the variables and fields the
// value passed through.
func (v *values) originsVia(e ast.Expr) (out []origin, via map[types.Object]bool, ok bool) {
	via = map[types.Object]bool{}
	ok = v.trace(e, -1, via, &out, 0)
	return out, via, ok
}

// field returns the values field name of the struct e evaluates to can
// hold: the literal's (nil when the literal leaves it out, the zero value)
// and every later assignment v.name = x to a variable e passed through. ok
// is false when e cannot be traced to struct literals of type pkg.typ.
func (v *values) field(e ast.Expr, pkg, typ, name string) (vals []ast.Expr, ok bool) {
	outs, via, ok := v.originsVia(e)
	if !ok || len(outs) == 0 {
		return nil, false
	}
	for _, o := range outs {
		lit, isLit := o.expr.(*ast.CompositeLit)
		if !isLit || !isNamed(v.info.TypeOf(lit), pkg, typ) {
			return nil, false
		}
		val, _ := fieldOf(lit, name)
		vals = append(vals, val)
	}
	for obj := range via {
		vals = append(vals, v.fields[obj][name]...)
	}
	return vals, true
}

func (v *values) trace(e ast.Expr, idx int, seen map[types.Object]bool, out *[]origin, depth int) bool {
	if depth > 8 {
		return false
	}
	if e == nil {
		*out = append(*out, origin{nil, -1})
		return true
	}
	e = ast.Unparen(e)
	if u, ok := e.(*ast.UnaryExpr); ok && u.Op == token.AND {
		e = ast.Unparen(u.X)
	}
	switch x := e.(type) {
	case *ast.CompositeLit, *ast.CallExpr, *ast.FuncLit, *ast.BasicLit:
		*out = append(*out, origin{x, idx})
		return true
	case *ast.Ident, *ast.SelectorExpr:
		obj := objOf(v.info, x)
		if obj == nil {
			return false
		}
		if _, isNil := obj.(*types.Nil); isNil {
			*out = append(*out, origin{x, -1})
			return true
		}
		vr, isVar := obj.(*types.Var)
		if !isVar {
			*out = append(*out, origin{x, idx})
			return true
		}
		// A variable of another package (http.DefaultClient) is its own
		// origin.
		if !vr.IsField() && vr.Pkg() != v.pkg {
			*out = append(*out, origin{x, idx})
			return true
		}
		if seen[obj] {
			return true
		}
		seen[obj] = true
		as := v.of[obj]
		if len(as) == 0 || v.escapes[obj] {
			return false
		}
		for _, a := range as {
			if a.idx == -2 || (a.op != token.ASSIGN && a.op != token.DEFINE) {
				return false
			}
			if !v.trace(a.rhs, a.idx, seen, out, depth+1) {
				return false
			}
		}
		return true
	}
	return false
}

// fieldValue returns the value of field name in a struct literal, the
// values later assigned to that field of the variable holding it, and
// whether the literal has the field at all.
func fieldOf(lit *ast.CompositeLit, name string) (ast.Expr, bool) {
	for _, el := range lit.Elts {
		if kv, ok := el.(*ast.KeyValueExpr); ok {
			if id, ok := kv.Key.(*ast.Ident); ok && id.Name == name {
				return kv.Value, true
			}
		}
	}
	return nil, false
}
