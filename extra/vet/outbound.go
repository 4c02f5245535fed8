package vet

import (
	"go/ast"
	"go/types"
	"strings"
)

// clientPackages are client libraries whose methods taking a
// context.Context first talk to another process.
var clientPackages = []string{
	"github.com/redis/go-redis/",
	"github.com/go-redis/redis/",
	"go.mongodb.org/mongo-driver/",
	"github.com/jackc/pgx/",
	pkgAWSService,
	pkgRetryable,
	"go.etcd.io/etcd/client/",
	"github.com/elastic/go-elasticsearch/",
	"github.com/segmentio/kafka-go",
	"github.com/nats-io/nats.go",
	"github.com/twmb/franz-go/",
	"cloud.google.com/go/",
}

var sqlTypes = []string{"DB", "Conn", "Tx", "Stmt"}

// outbound reports whether call talks to another process: an HTTP request,
// a dial, a database query, a gRPC method, a guardrail call, or a method of
// a known client library. It names what it recognised.
func outbound(info *types.Info, call *ast.CallExpr) (string, bool) {
	fn := callee(info, call)
	if fn == nil {
		return "", false
	}
	switch {
	case isFunc(fn, "net/http", "Get", "Head", "Post", "PostForm"),
		isMethod(fn, "net/http", "Client", "Do", "Get", "Head", "Post", "PostForm"),
		isMethod(fn, "net/http", "Transport", "RoundTrip"),
		isMethod(fn, "net/http", "RoundTripper", "RoundTrip"),
		isFunc(fn, "net", "Dial", "DialTimeout", "DialTCP"),
		isMethod(fn, "net", "Dialer", "Dial", "DialContext"),
		isFunc(fn, pkgGuardrail, "Do", "DoCall"):
		return calleeName(fn), true
	}
	if pkgPath(fn) == "database/sql" {
		for _, t := range sqlTypes {
			if isMethod(fn, "database/sql", t, "Query", "QueryContext", "QueryRow", "QueryRowContext",
				"Exec", "ExecContext", "Ping", "PingContext", "Prepare", "PrepareContext",
				"Begin", "BeginTx") {
				return calleeName(fn), true
			}
		}
	}
	if grpcCall(fn) {
		return calleeName(fn), true
	}
	if clientMethod(fn) {
		return calleeName(fn), true
	}
	return "", false
}

// grpcCall reports whether fn is a gRPC client method: its last parameter
// is ...grpc.CallOption, as in every generated client.
func grpcCall(fn *types.Func) bool {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || !sig.Variadic() || sig.Params().Len() == 0 {
		return false
	}
	last := sig.Params().At(sig.Params().Len() - 1).Type()
	s, ok := types.Unalias(last).(*types.Slice)
	return ok && isNamed(s.Elem(), pkgGRPC, "CallOption")
}

// clientMethod reports whether fn is a method of a known client library
// that takes a context first.
func clientMethod(fn *types.Func) bool {
	sig, ok := fn.Type().(*types.Signature)
	if !ok || sig.Recv() == nil || sig.Params().Len() == 0 || !isContext(sig.Params().At(0).Type()) {
		return false
	}
	p := pkgPath(fn)
	for _, c := range clientPackages {
		if strings.HasPrefix(p, c) || p == strings.TrimSuffix(c, "/") {
			return true
		}
	}
	return false
}

// contextArg returns the argument of call that carries the context of an
// outbound call, when call is one: http.NewRequestWithContext's ctx,
// req.WithContext's, a dial's, a query's, a gRPC method's, guardrail.Do's.
func contextArg(info *types.Info, call *ast.CallExpr) (ast.Expr, string, bool) {
	fn := callee(info, call)
	if fn == nil || len(call.Args) == 0 {
		return nil, "", false
	}
	switch {
	case isFunc(fn, "net/http", "NewRequestWithContext"),
		isMethod(fn, "net/http", "Request", "WithContext", "Clone"),
		isMethod(fn, "net", "Dialer", "DialContext"),
		isMethod(fn, "net", "Resolver", "LookupHost", "LookupIPAddr", "LookupIP", "LookupAddr", "LookupSRV"),
		isFunc(fn, pkgGuardrail, "Do", "DoCall"):
		return call.Args[0], calleeName(fn), true
	}
	if pkgPath(fn) == "database/sql" && strings.HasSuffix(fn.Name(), "Context") || isMethod(fn, "database/sql", "DB", "BeginTx") || isMethod(fn, "database/sql", "Conn", "BeginTx") {
		if isContext(info.TypeOf(call.Args[0])) {
			return call.Args[0], calleeName(fn), true
		}
	}
	if grpcCall(fn) || clientMethod(fn) {
		if isContext(info.TypeOf(call.Args[0])) {
			return call.Args[0], calleeName(fn), true
		}
	}
	return nil, "", false
}
